import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode()
            if text == "error":
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("text_echo was asked to fail")))
                continue
            if text == "oom":
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("CUDA out of memory. Tried to allocate 2 GiB"))
                )
                continue
            params = {k: v for k, v in json.loads(request.parameters()).items() if isinstance(v, (bool, int, str))}
            outputs = [
                pb_utils.Tensor("text_output", np.array([text.upper().encode()], dtype=np.object_)),
                pb_utils.Tensor("length", np.array([len(text)], dtype=np.int32)),
                pb_utils.Tensor("scores", np.array([0.5, 1.5, 2.5], dtype=np.float32)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs, parameters=params))
        return responses
