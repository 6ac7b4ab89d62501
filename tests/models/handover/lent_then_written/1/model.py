"""Sends OUT = IN, then OUT = IN + 1 written into the input array, then the final flag."""

import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", request.inputs()[0].as_numpy())]))
            threading.Thread(target=self._later, args=(request, sender)).start()
        return None

    def _later(self, request, sender):
        time.sleep(0.1)
        data = request.inputs()[0].as_numpy()
        data += 1.0
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
