"""Answers '<prompt> | <parameters as sorted JSON> | corr <correlation id> | run <n>' (see config.pbtxt)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executed = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.executed += 1
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            params = json.dumps(json.loads(request.parameters()), sort_keys=True)
            text = f"{prompt.decode()} | {params} | corr {request.correlation_id()} | run {self.executed}"
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
            ]))
        return responses
