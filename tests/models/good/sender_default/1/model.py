import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            sender = request.get_response_sender()

            def answer(sender=sender, data=data):
                # From another thread, after execute has returned.
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", data * 2)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Timer(0.05, answer).start()
        return None
