"""DATA: SIZE bytes of the pattern 0, 1, ..., 250, 0, 1, ...; COUNT: requests executed so far."""

import numpy as np
import triton_python_backend_utils as pb_utils

PATTERN = np.arange(251, dtype=np.uint8)


class TritonPythonModel:
    def initialize(self, args):
        self.executed = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.executed += 1
            size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("DATA", np.resize(PATTERN, size)),
                pb_utils.Tensor("COUNT", np.array([self.executed], dtype=np.int64)),
            ]))
        return responses
