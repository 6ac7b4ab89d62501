"""A 4-number vector per text: [length, words, sum of bytes / 1000, first byte] (see config.pbtxt)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            vector = np.array([len(text), len(text.split()), sum(text) / 1000.0, text[0] if text else 0],
                              dtype=np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("embedding", vector),
                pb_utils.Tensor("num_input_tokens", np.array([len(text.split())], dtype=np.uint32)),
            ]))
        return responses
