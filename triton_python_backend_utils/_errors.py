"""The two error types of pb_utils: TritonModelException, raised to model code,
and TritonError, the error a model attaches to an InferenceResponse."""

from __future__ import annotations

import enum


class TritonModelException(Exception):
    """Exception raised by the utilities (and by models) on failure."""


class _ErrorCode(enum.IntEnum):
    # Values of TRITONSERVER_Error_Code.
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """An error attached to an InferenceResponse.

    ``TritonError(message, code=TritonError.INTERNAL)``; ``code`` is one of
    the class constants (UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG,
    UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED).
    """

    __slots__ = ("_message", "_code")

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message, code=_ErrorCode.INTERNAL):
        if not isinstance(message, str):
            raise TypeError(
                "TritonError(): 'message' must be a str, got "
                + type(message).__name__
            )
        if not isinstance(code, _ErrorCode):
            # Triton's binding takes only the TritonError.<CODE> constants, not plain ints.
            raise TypeError(
                "TritonError(): 'code' must be one of the TritonError codes (TritonError.INTERNAL, ...), got "
                + repr(code)
            )
        self._message = message
        self._code = code

    def message(self):
        return self._message

    def code(self):
        return self._code

    def __repr__(self):
        return "TritonError(%r, TritonError.%s)" % (self._message, self._code.name)
