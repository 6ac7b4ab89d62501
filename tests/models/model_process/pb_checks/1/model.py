"""Calls pb_utils with wrong argument types (see cases.py) and reports what was raised.

initialize's results go to $PROBE_OUT/pb_checks.json (when set); execute
returns initialize's and its own as REPORT.
"""

import json
import os

import numpy as np

import triton_python_backend_utils as pb_utils

from .cases import INITIALIZE, execute_cases, run


class TritonPythonModel:
    def initialize(self, args):
        self.results = run(INITIALIZE)
        out = os.environ.get("PROBE_OUT")
        if out:
            with open(os.path.join(out, "pb_checks.json"), "w") as f:
                json.dump(self.results, f)

    def execute(self, requests):
        responses = []
        for request in requests:
            results = dict(self.results)
            results.update(run(execute_cases(request)))
            text = json.dumps(results).encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([text], dtype=np.object_))]))
        return responses
