import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = request.parameters()
            params = json.loads(text)
            params["echoed_by"] = "params_echo"
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("PARAMS_JSON", np.array([text.encode()], dtype=np.object_))],
                    parameters=params,
                )
            )
        return responses
