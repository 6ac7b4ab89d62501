import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for value in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy():
                if value == -999:
                    raise ValueError("stream_error was told to fail")
                if value < 0:
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"negative value {value}")))
                else:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
