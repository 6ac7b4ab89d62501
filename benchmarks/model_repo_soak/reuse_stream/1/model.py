"""Streams four answers per request from one buffer it refills between sends, on its own thread."""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils

RESPONSES = 4


class TritonPythonModel:
    def initialize(self, args):
        self.buf = np.empty(1 << 18, np.int32)  # 1 MiB, shared by every request
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            v = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            threading.Thread(target=self._stream, args=(v, request.get_response_sender()), daemon=True).start()
        return None

    def _stream(self, v, sender):
        with self.lock:
            for i in range(RESPONSES):
                self.buf[:] = v * 10 + i
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", self.buf)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
