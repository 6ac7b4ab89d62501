"""First code a worker runs inside a custom execution environment.

Started as `<env>/bin/python -s .../backends/python/envboot.py <module> [args]`
(a script path, not `-m`, because nothing of Kernel is importable yet). It uses
the standard library only and runs on any Python Kernel supports.

It makes exactly these importable, and nothing else of the server's:

* Kernel's own pure-Python packages (`kernel` with `kernel.backends`,
  `triton_python_backend_utils`), ahead of anything in the environment;
* the worker's binary dependencies the environment lacks (numpy, msgspec,
  uvloop), lent from the server's installation only when the front process
  found the environment's Python ABI identical to the server's. They are
  consulted after the environment's own packages, so an environment that has
  them always uses its own;
* the server's site-packages, after the environment's, only when the model
  asked for them (KERNEL_INHERIT_SERVER_PACKAGES).

Then it runs `<module>` as `__main__`.
"""

import importlib.abc
import importlib.machinery
import json
import os
import runpy
import site
import sys

SPEC_VARIABLE = "KERNEL_WORKER_IMPORTS"


class _TopLevelFrom(importlib.abc.MetaPathFinder):
    """Finds the listed packages (top-level, or a subpackage such as kernel.backends) in the given
    directories, nothing else."""

    def __init__(self, table):
        self.table = dict(table)

    def find_spec(self, fullname, path=None, target=None):
        directory = self.table.get(fullname)
        if directory is None:
            return None  # other submodules resolve through their package's __path__
        return importlib.machinery.PathFinder.find_spec(fullname, [directory])


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        del sys.path[0]  # this script's folder is not an import root
    spec = json.loads(os.environ.pop(SPEC_VARIABLE, "") or "{}")
    if spec.get("own"):
        sys.meta_path.insert(0, _TopLevelFrom(spec["own"]))
    if spec.get("lent"):
        sys.meta_path.append(_TopLevelFrom(spec["lent"]))
    for entry in spec.get("extra_path", ()):
        site.addsitedir(entry)  # appended after the environment's own, .pth files honoured
    if len(sys.argv) < 2:
        sys.stderr.write("usage: envboot.py MODULE [ARGS...]\n")
        sys.exit(2)
    module = sys.argv[1]
    sys.argv = [module] + sys.argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
