"""Makes a BLS call from initialize, which Triton refuses: the load fails."""

import numpy as np

import triton_python_backend_utils as pb_utils


def _call():
    request = pb_utils.InferenceRequest(
        model_name="bls_in_finalize",
        inputs=[pb_utils.Tensor("IN", np.array([1.0], np.float32))],
        requested_output_names=["OUT"],
    )
    return request.exec()


class TritonPythonModel:
    def initialize(self, args):
        _call()

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
