"""Answers each request of a batch its own way, chosen by its MODE input.

"return": in the list execute returns; "send_before": through the request's
response sender before execute returns (None in the returned list);
"send_after": through the sender from a thread, after execute has returned
(None in the list). "send_then_final" and "send_after_then_final" do the same in two
sends, as Triton's QA model response_sender does: the response with flags 0, then the
FINAL flag alone. OUT = 10 * IN; BATCH = how many requests that execute got.
"""

import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _response(request, batch):
    value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    return pb_utils.InferenceResponse([
        pb_utils.Tensor("OUT", (value * 10).astype(np.int32)),
        pb_utils.Tensor("BATCH", np.full(value.shape, batch, np.int32)),
    ])


def _send(request, batch, separate_final):
    sender = request.get_response_sender()
    if separate_final:
        sender.send(_response(request, batch))
        sender.send(flags=FINAL)
    else:
        sender.send(_response(request, batch), FINAL)


def _send_later(request, batch, separate_final):
    time.sleep(0.2)
    _send(request, batch, separate_final)


class TritonPythonModel:
    def execute(self, requests):
        batch = len(requests)
        returned = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().reshape(-1)[0].decode()
            if mode == "return":
                returned.append(_response(request, batch))
            elif mode in ("send_before", "send_then_final"):
                _send(request, batch, mode.endswith("_final"))
                returned.append(None)
            else:
                threading.Thread(target=_send_later, args=(request, batch, mode.endswith("_final"))).start()
                returned.append(None)
        return returned
