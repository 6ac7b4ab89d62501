"""OUT = IN, written into one buffer the model reuses for every request, sent through the sender."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.buffer = np.zeros(0, np.float32)

    def execute(self, requests):
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if self.buffer.shape != data.shape:
                self.buffer = np.empty(data.shape, np.float32)
            self.buffer[...] = data
            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", self.buffer)]),
                                               flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
