"""A model that only loads inside its execution environment.

`kernel_envtest_pkg` exists only in the environment the tests build, so this
module's import proves where it runs (tests may append an auto-complete hook,
to prove that runs there too). OUTPUT0 = INPUT0 + kernel_envtest_pkg.ANSWER;
INFO describes the interpreter.
"""

import importlib.util
import json
import os
import sys

import kernel_envtest_pkg  # only in the execution environment
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        def where(name):
            spec = importlib.util.find_spec(name)
            return None if spec is None else spec.origin

        self.info = json.dumps(
            {
                "answer": kernel_envtest_pkg.ANSWER,
                "package_file": kernel_envtest_pkg.__file__,
                "executable": sys.executable,
                "prefix": sys.prefix,
                "version": list(sys.version_info[:3]),
                "httpx": where("httpx"),
                "numpy": np.__file__,
                "msgspec": where("msgspec"),
                "no_user_site": bool(sys.flags.no_user_site),
                "PYTHONNOUSERSITE": os.environ.get("PYTHONNOUSERSITE"),
                "VIRTUAL_ENV": os.environ.get("VIRTUAL_ENV"),
                "model_name": args["model_name"],
            }
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x + kernel_envtest_pkg.ANSWER).astype(np.float32))
            info = pb_utils.Tensor("INFO", np.array([self.info.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out, info]))
        return responses
