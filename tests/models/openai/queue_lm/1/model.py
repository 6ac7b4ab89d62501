"""Answers "done" after one second (see config.pbtxt)."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(1.0)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", np.array([[b"done"]], dtype=np.object_))]) for _ in requests]
