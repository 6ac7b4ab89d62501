"""OUT = 2 * IN (a new array)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", 2 * r.inputs()[0].as_numpy())]) for r in requests]
