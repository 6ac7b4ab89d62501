"""Error type shared by the core, transports and backends.

The codes mirror TRITONSERVER_Error_Code so each transport can map them to the
status its protocol uses (HTTP status, gRPC status) exactly as Triton does.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


class KernelError(Exception):
    """An error with a Triton error category; the message is what the client sees."""

    __slots__ = ("code", "message")

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"KernelError({self.code.name}, {self.message!r})"


def invalid_arg(message: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, message)


def internal(message: str) -> KernelError:
    return KernelError(ErrorCode.INTERNAL, message)


def unavailable(message: str) -> KernelError:
    return KernelError(ErrorCode.UNAVAILABLE, message)


def not_found(message: str) -> KernelError:
    return KernelError(ErrorCode.NOT_FOUND, message)


def unsupported(message: str) -> KernelError:
    return KernelError(ErrorCode.UNSUPPORTED, message)
