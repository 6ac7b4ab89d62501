"""Decoupled: sends COUNT responses (OUT = 0, 1, ...) DELAY_MS apart, then the final flag.

Between responses it checks is_cancelled() (unless IGNORE_CANCEL) and, once
cancelled, logs it and ends the stream with the final flag alone.
"""

import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


def _value(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._stream, args=(request,), daemon=True).start()
        return None

    def _stream(self, request):
        count = _value(request, "COUNT")
        delay = _value(request, "DELAY_MS") / 1000.0
        ignore = bool(_value(request, "IGNORE_CANCEL"))
        sender = request.get_response_sender()
        for i in range(count):
            if not ignore and request.is_cancelled():
                pb_utils.Logger.log_info(f"stream_callee saw the cancellation after {i} responses")
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            time.sleep(delay)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
