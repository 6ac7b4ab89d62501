"""A model whose initialize() takes longer than the stub timeout the tests set (2 s): Triton waits for it."""

import time

import triton_python_backend_utils as pb_utils

INIT_SECONDS = 6.5


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(INIT_SECONDS)

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
