"""Decoupled "repeat" model: one response per element of IN, then a final flag.

Each request is answered from a thread of its own through the request's response sender, so
execute returns at once and several requests stream responses at the same time (the way a
decoupled Python-backend model is usually written). Written against triton_python_backend_utils:
real Triton and Kernel load the same file.
"""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running = 0

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy().reshape(-1)
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy().reshape(-1)
            if delays.shape[0] != values.shape[0]:
                raise pb_utils.TritonModelException("IN and DELAY must have the same length")
            with self._lock:
                self._running += 1
            sender = request.get_response_sender()
            threading.Thread(target=self._answer, args=(sender, values, delays, int(wait[0]) if wait.size else 0),
                             daemon=True).start()
        return None

    def _answer(self, sender, values, delays, wait_ms):
        try:
            for i in range(values.shape[0]):
                if delays[i]:
                    time.sleep(int(delays[i]) / 1000.0)
                out = pb_utils.Tensor("OUT", np.array([values[i]], dtype=np.int32))
                idx = pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out, idx]))
            if wait_ms:
                time.sleep(wait_ms / 1000.0)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            with self._lock:
                self._running -= 1
                self._idle.notify_all()

    def finalize(self):
        with self._lock:
            self._idle.wait_for(lambda: self._running == 0, timeout=5.0)
