"""Sends OUT = BASE + i (i = 0..3) from one buffer it refills between sends, then the final flag."""

import threading

import numpy as np

import triton_python_backend_utils as pb_utils

COUNT = 4


def _value(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0]


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            if int(_value(request, "FROM_THREAD")):
                threading.Thread(target=self._stream, args=(request,)).start()
            else:
                self._stream(request)
        return None

    def _stream(self, request):
        buffer = np.empty(int(_value(request, "N")), np.float32)
        base = float(_value(request, "BASE"))
        sender = request.get_response_sender()
        for i in range(COUNT):
            buffer[:] = base + i
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", buffer)]))
        buffer[:] = -1.0
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
