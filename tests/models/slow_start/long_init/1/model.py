"""A model whose initialize() takes two minutes (a large model being read): the operator tests
signal the server, probe it and take its ports while this load runs, and never wait for its end."""

import os
import time

import triton_python_backend_utils as pb_utils

INIT_SECONDS = 120


class TritonPythonModel:
    def initialize(self, args):
        # The tests wait for this line, then check that this process is gone when the server is.
        pb_utils.Logger.log_info(f"long_init initializing in pid {os.getpid()}")
        time.sleep(INIT_SECONDS)

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
