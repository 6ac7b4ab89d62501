"""Answers "<count> <size>" with <count> responses of <size> letters (see config.pbtxt)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            parts = prompt[:64].split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                count, size = int(parts[0]), int(parts[1])
            else:
                count, size = 1, 0
            for i in range(count):
                if request.is_cancelled():
                    break
                text = b"a" * size if size else b"ok"
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("text_output", np.array([text], dtype=np.object_))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
