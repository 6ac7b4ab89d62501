"""is_ready() that takes DELAY_S seconds (set by the last request); CALLS counts its calls so far."""

import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.delay = 0.0
        self.calls = 0

    def is_ready(self):
        self.calls += 1
        time.sleep(self.delay)
        return True

    def execute(self, requests):
        responses = []
        for request in requests:
            self.delay = float(pb_utils.get_input_tensor_by_name(request, "DELAY_S").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("CALLS", np.array([self.calls], np.int32))]))
        return responses
