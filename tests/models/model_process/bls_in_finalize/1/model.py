"""Serves IN -> OUT; makes a BLS call from finalize, which Triton refuses (and logs)."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]

    def finalize(self):
        request = pb_utils.InferenceRequest(
            model_name="bls_in_finalize",
            inputs=[pb_utils.Tensor("IN", np.array([1.0], np.float32))],
            requested_output_names=["OUT"],
        )
        request.exec()
