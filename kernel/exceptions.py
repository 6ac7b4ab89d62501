"""Errors raised by Kernel's PyTriton-compatible API (`pytriton.exceptions` -> `kernel.exceptions`).

Class names and hierarchy are PyTriton's, so `except PyTritonError` style handling in
existing programs keeps working after the import swap.
"""

from __future__ import annotations


class MessageMixin:
    """What both PyTriton error families share: built from one message, kept as `.message`, shown by str().

    A mixin rather than a common base class because the two families are unrelated in PyTriton:
    PyTritonError and PyTritonClientError each derive straight from Exception.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self._message = message

    def __str__(self) -> str:
        return self._message

    @property
    def message(self) -> str:
        return self._message


class PyTritonError(MessageMixin, Exception):
    """Base of every error raised by the PyTriton-compatible server-side API."""


class PyTritonValidationError(PyTritonError):
    """A configuration value failed validation."""


class PyTritonInvalidOperationError(PyTritonError):
    """The operation is not allowed in the object's current state."""


class PyTritonBadParameterError(PyTritonError):
    """An argument has a wrong value."""


class PyTritonModelConfigError(PyTritonError):
    """A model configuration is invalid."""


class PyTritonUnrecoverableError(PyTritonError):
    """The inference callable failed so that no further inference is possible."""


class PyTritonRuntimeError(PyTritonError):
    """An error that fits none of the other categories."""
