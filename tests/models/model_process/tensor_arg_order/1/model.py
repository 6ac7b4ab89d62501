"""Which check pb_utils.Tensor makes first when two arguments are wrong at once (an empty name and
no array): the argument types (a TypeError, as pybind11 converts them before the body runs) or the
name's value. REPORT: {case: exception type name}, compared with tritonserver 2.51 by the peer check.
"""

import json

import numpy as np

import triton_python_backend_utils as pb_utils

CASES = {
    "empty name, no array": lambda: pb_utils.Tensor("", None),
    "empty name, an array": lambda: pb_utils.Tensor("", np.zeros(1, np.float32)),
    "empty name, from_dlpack of None": lambda: pb_utils.Tensor.from_dlpack("", None),
    "a name, no array": lambda: pb_utils.Tensor("x", None),
}


def _raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - which exception is the point
        return type(exc).__name__
    return ""


class TritonPythonModel:
    def execute(self, requests):
        text = json.dumps({label: _raised(call) for label, call in CASES.items()}).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([text], np.object_))])
                for _ in requests]
