import sys

from kernel.serve.cli import main

sys.exit(main())
