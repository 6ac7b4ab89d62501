"""N bytes of SEED % 251: a large answer that costs the client nothing to ask for."""

import numpy as np
import triton_python_backend_utils as pb_utils

MAX_N = 64 << 20


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            seed = int(pb_utils.get_input_tensor_by_name(request, "SEED").as_numpy()[0])
            if not 0 <= n <= MAX_N:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"N must be 0..{MAX_N}")))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(n, seed % 251, np.uint8))]))
        return responses
