"""The `parameters` of a KServe v2 JSON inference request, checked where they enter.

Why here: a value of the wrong type used to travel on to a scheduler or a
worker (a `sequence_id` of null killed the worker, one of 2**64 could not be
encoded and wedged the model). Every control parameter is type-checked as
Triton's HTTP front does, with its messages; the other parameters may only be
what Triton accepts (int, bool, string, and the JSON numbers it reads as
doubles). A refusal is a KernelError(INVALID_ARG): 400 on every HTTP front
(KServe, SageMaker, Vertex AI), which all parse through here.
"""

from __future__ import annotations

from typing import Optional

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import (
    REQUEST_FLAG_SEQUENCE_END,
    REQUEST_FLAG_SEQUENCE_START,
    InferRequest,
    check_correlation_id,
)

UINT64_MAX = (1 << 64) - 1


def _bad(message: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, message)


def uint64(key: str, value) -> int:
    """`value` when it is a JSON unsigned integer that fits 64 bits (bool is not an integer here)."""
    if type(value) is int and 0 <= value <= UINT64_MAX:
        return value
    raise _bad(f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as unsigned-integer")


def boolean(key: str, value) -> bool:
    if type(value) is bool:
        return value
    raise _bad(f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")


def sequence_id(value):
    """A correlation id as Triton takes it over HTTP: a uint64 or a string."""
    if type(value) is str or (type(value) is int and 0 <= value <= UINT64_MAX):
        return check_correlation_id(value)
    raise _bad("Unable to parse 'sequence_id': attempt to access JSON non-string as string")


def _model_parameter(key: str, value) -> None:
    if key.startswith("triton_"):
        raise _bad("parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.")
    if type(value) not in (int, bool, str, float):
        raise _bad(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def apply(request: InferRequest, raw: Optional[dict]) -> bool:
    """Move the control parameters in `raw` onto `request`, the rest into its parameters.

    Returns the request's `binary_data_output` choice.
    """
    if not raw:
        return False
    params = request.parameters
    binary_default = False
    flags = 0
    for key, value in raw.items():
        if key == "sequence_id":
            request.correlation_id = sequence_id(value)
        elif key == "sequence_start":
            if boolean(key, value):
                flags |= REQUEST_FLAG_SEQUENCE_START
        elif key == "sequence_end":
            if boolean(key, value):
                flags |= REQUEST_FLAG_SEQUENCE_END
        elif key == "priority":
            request.priority = uint64(key, value)
        elif key == "timeout":
            request.timeout_us = uint64(key, value)
        elif key == "binary_data_output":
            binary_default = boolean(key, value)
        else:
            _model_parameter(key, value)
            params[key] = value
    request.flags |= flags
    return binary_default
