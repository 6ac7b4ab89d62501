"""Sends OUT = IN + i for i = 1, 2, 3, each written into the input array itself, then the final flag."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for _ in range(3):
                data += 1.0
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]))
            data[:] = -1.0
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
