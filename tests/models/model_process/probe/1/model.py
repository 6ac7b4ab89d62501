"""Reports what a model sees of its own process, the way Triton's stub shows it.

initialize(args) keys, values and types; sys.argv; sys.path; the environment;
the module's own __name__/__package__; relative, version-folder and
model-folder imports. Written to $PROBE_OUT/<instance>.json at initialize (when
set) and returned as REPORT by execute.
"""

import argparse
import json
import os
import sys
import unittest

import numpy as np

import triton_python_backend_utils as pb_utils

import helpers as version_folder_helpers  # the version folder is on sys.path
import top  # so is the model folder

from .helpers import describe  # the version folder is a package

# A model that is also a command-line tool parses sys.argv at import: Triton's is [""].
IMPORT_ARGS = argparse.ArgumentParser().parse_args()


class SelfTest(unittest.TestCase):
    def test_relative_import(self):
        self.assertEqual(describe()["package"], __package__)


class TritonPythonModel:
    def initialize(self, args):
        # The self-test pattern: unittest.main() parses sys.argv too.
        program = unittest.main(module=__name__, exit=False, verbosity=0)
        self.report = {
            "args": args,
            "arg_keys": list(args),
            "arg_types": sorted({type(v).__name__ for v in args.values()}),
            "argv": sys.argv,
            "path": sys.path,
            "cwd": os.getcwd(),
            "env": sorted(os.environ),
            "name": __name__,
            "package": __package__,
            "file": __file__,
            "module_keys": sorted(k for k, m in sys.modules.items() if getattr(m, "__file__", None) == __file__),
            "helpers": describe(),
            "version_folder_helpers": version_folder_helpers.__name__,
            "top": top.WHERE,
            "import_args": vars(IMPORT_ARGS),
            "self_test": [program.result.testsRun, program.result.wasSuccessful()],
            "model_dir": pb_utils.get_model_dir(),
        }
        out = os.environ.get("PROBE_OUT")
        if out:
            with open(os.path.join(out, args["model_instance_name"] + ".json"), "w") as f:
                json.dump(self.report, f)

    def execute(self, requests):
        text = json.dumps(self.report).encode()
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([text], dtype=np.object_))])
            for _ in requests
        ]
