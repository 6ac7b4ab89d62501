"""Errors raised by the clients (`pytriton.client.exceptions` -> `kernel.client.exceptions`).

Names and hierarchy follow PyTriton 0.7: every error is a PyTritonClientError
carrying its text in `.message`.
"""

from __future__ import annotations

from kernel.exceptions import MessageMixin


class PyTritonClientError(MessageMixin, Exception):
    """Base of every client error (not a PyTritonError, as in PyTriton)."""


class PyTritonClientValueError(PyTritonClientError):
    """A call got arguments it cannot use."""


class PyTritonClientInvalidUrlError(PyTritonClientValueError):
    """The server url cannot be parsed or uses an unsupported scheme."""


class PyTritonClientTimeoutError(PyTritonClientError):
    """The server did not answer (or become ready) in time."""


class PyTritonClientModelUnavailableError(PyTritonClientError):
    """The server has no usable model of this name (and version)."""


class PyTritonClientModelNotReadyError(PyTritonClientTimeoutError, PyTritonClientModelUnavailableError):
    """The model did not become ready within init_timeout_s, and the server does not know it (never
    there, or unloaded: a RemoteTriton block that bound it has closed). PyTriton 0.7's clients wait for
    readiness and then raise PyTritonClientTimeoutError, which this is; it is also a
    PyTritonClientModelUnavailableError, for code that tells the two apart (Kernel only)."""


class PyTritonClientClosedError(PyTritonClientError):
    """The client was used after close()."""


class PyTritonClientModelDoesntSupportBatchingError(PyTritonClientError):
    """infer_batch was called for a model without a batch dimension (max_batch_size 0)."""


class PyTritonClientInferenceServerError(PyTritonClientError):
    """The server or the model reported an error for the request."""


class PyTritonClientQueueFullError(PyTritonClientError):
    """FuturesModelClient's request queue is full."""
