"""InferenceRequest (handed to execute, or built by a model for BLS) and its
options: PreferredMemory and InferenceTrace."""

from __future__ import annotations

import enum
import numbers

import numpy as np

from . import _hooks as hooks
from ._errors import TritonModelException
from ._parameters import parameters_to_json
from ._response import InferenceResponseSender
from ._tensor import Tensor
from ._types import TRITONSERVER_REQUEST_RELEASE_ALL


class _PreferredMemoryType(enum.IntEnum):
    GPU = 0
    CPU = 1
    DEFAULT = 2


TRITONSERVER_MEMORY_GPU = _PreferredMemoryType.GPU
TRITONSERVER_MEMORY_CPU = _PreferredMemoryType.CPU


class PreferredMemory:
    """Where a BLS caller wants output tensors placed.

    ``PreferredMemory(preferred_memory_type, preferred_device_id=0)`` with
    TRITONSERVER_MEMORY_GPU or TRITONSERVER_MEMORY_CPU.  The BLS handler reads
    ``_memory_type`` (0 GPU, 1 CPU, 2 no preference) and ``_device_id``.
    """

    __slots__ = ("_memory_type", "_device_id")

    def __init__(self, preferred_memory_type, preferred_device_id=0):
        if not isinstance(preferred_memory_type, _PreferredMemoryType):
            # Triton's binding takes the TRITONSERVER_MEMORY_* constants only, not plain ints.
            raise TypeError(
                "preferred_memory_type must be TRITONSERVER_MEMORY_GPU or TRITONSERVER_MEMORY_CPU, got "
                + repr(preferred_memory_type)
            )
        if isinstance(preferred_device_id, bool) or not isinstance(preferred_device_id, int):
            raise TypeError("preferred_device_id must be an int")
        self._memory_type = _PreferredMemoryType(preferred_memory_type)
        self._device_id = preferred_device_id

    def __repr__(self):
        return "PreferredMemory(%s, %d)" % (self._memory_type.name, self._device_id)


class InferenceTrace:
    """Trace handle of a request; ``get_context()`` is the trace context
    string, or None when the request is not traced."""

    __slots__ = ("_context",)

    def __init__(self, context=None):
        self._context = context or None

    def get_context(self):
        return self._context


_DEFAULT_PREFERRED_MEMORY = PreferredMemory(_PreferredMemoryType.DEFAULT, 0)
_DEFAULT_TRACE = InferenceTrace()
_REQUIRED = object()

def _flag(value):
    """A bool argument as Triton's binding converts it: bools and numbers, nothing else."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Number):
        return bool(value)
    raise TypeError("decoupled must be a bool, got " + type(value).__name__)


def _check_uint(value, what):
    """An unsigned int argument as Triton's binding converts it (bools are ints there too)."""
    if not isinstance(value, int):
        raise TypeError(what + " must be an int, got " + type(value).__name__)
    if value < 0:
        raise TypeError(what + " must not be negative")
    return int(value)


class InferenceRequest:
    """An inference request.

    Models receive these in ``execute``.  They also build them for BLS::

        InferenceRequest(model_name=..., requested_output_names=[...],
                         inputs=[...], request_id="", correlation_id=0,
                         model_version=-1, flags=0, timeout=0,
                         preferred_memory=PreferredMemory(...),
                         trace=InferenceTrace(), parameters=None)

    and run them with ``exec(decoupled=False)`` or ``await
    async_exec(decoupled=False)``.
    """

    __slots__ = (
        "_inputs", "_request_id", "_correlation_id", "_flags",
        "_requested_output_names", "_parameters", "_model_name",
        "_model_version", "_timeout", "_preferred_memory", "_trace",
        "_response_sender", "_cancel_check", "_release_flags",
    )

    def __init__(
        self,
        request_id="",
        correlation_id=0,
        inputs=_REQUIRED,
        requested_output_names=_REQUIRED,
        model_name=_REQUIRED,
        model_version=-1,
        flags=0,
        timeout=0,
        preferred_memory=_DEFAULT_PREFERRED_MEMORY,
        trace=_DEFAULT_TRACE,
        parameters=None,
    ):
        missing = [
            arg for arg, value in (
                ("inputs", inputs),
                ("requested_output_names", requested_output_names),
                ("model_name", model_name),
            ) if value is _REQUIRED
        ]
        if missing:
            raise TypeError(
                "InferenceRequest() missing required argument(s): " + ", ".join(missing)
            )
        # Triton's binding takes bytes for string arguments too (a BYTES tensor
        # element is bytes), so decode them rather than refuse.
        if isinstance(request_id, bytes):
            request_id = request_id.decode("utf-8")
        if isinstance(model_name, bytes):
            model_name = model_name.decode("utf-8")
        if not isinstance(request_id, str):
            raise TypeError("request_id must be a str")
        if not isinstance(model_name, str):
            raise TypeError("model_name must be a str")
        if isinstance(model_version, bool) or not isinstance(model_version, int):
            raise TypeError("model_version must be an int")
        if correlation_id is None:
            raise TypeError("correlation_id must be an int or a str, got None")
        if isinstance(correlation_id, str):
            pass
        elif isinstance(correlation_id, int):
            if correlation_id < 0:
                # Triton's binding fails to convert it to its unsigned id: a RuntimeError there too.
                raise RuntimeError("correlation_id " + str(correlation_id) + " does not fit an unsigned 64-bit id")
        else:
            raise TritonModelException("Correlation ID must be integer or string")
        _check_uint(flags, "flags")
        _check_uint(timeout, "timeout")
        if not isinstance(preferred_memory, PreferredMemory):
            raise TypeError("preferred_memory must be a PreferredMemory")
        if not isinstance(trace, InferenceTrace):
            raise TypeError("trace must be an InferenceTrace")
        if isinstance(inputs, (str, bytes)) or isinstance(requested_output_names, (str, bytes)):
            raise TypeError("inputs and requested_output_names must be lists")
        inputs = list(inputs)
        for tensor in inputs:
            if tensor is None:
                raise TritonModelException(
                    "Input tensor for request with id '" + request_id
                    + "' and model name '" + model_name + "' should not be empty."
                )
            if not isinstance(tensor, Tensor):
                raise TypeError(
                    "inputs must contain Tensor objects, found " + type(tensor).__name__
                )
        names = []
        for output_name in requested_output_names:
            if not isinstance(output_name, str):
                raise TypeError("requested_output_names must contain str")
            if output_name == "":
                raise TritonModelException(
                    "Requested output name for request with id '" + request_id
                    + "' and model name '" + model_name + "' should not be empty."
                )
            if output_name not in names:
                names.append(output_name)
        self._inputs = inputs
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._requested_output_names = names
        self._parameters = parameters_to_json(parameters)
        self._model_name = model_name
        self._model_version = model_version
        self._timeout = timeout
        self._preferred_memory = preferred_memory
        self._trace = trace
        self._response_sender = None
        self._cancel_check = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _server_side(
        cls,
        inputs,
        request_id,
        correlation_id,
        flags,
        requested_output_names,
        parameters_json,
        model_name,
        model_version,
        response_sender=None,
        cancel_check=None,
        timeout=0,
        trace_context=None,
    ):
        """Worker hook: the request object handed to ``execute``.

        ``inputs`` is a list of Tensor, ``correlation_id`` an int or str,
        ``requested_output_names`` the outputs to return (all of the model's
        outputs when the client named none), ``parameters_json`` the JSON
        string ``parameters()`` returns, ``response_sender`` an
        InferenceResponseSender, ``cancel_check`` a zero-argument callable
        returning True once the request is cancelled (defaults to the
        sender's callback).
        """
        request = cls.__new__(cls)
        request._inputs = inputs
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._flags = flags
        request._requested_output_names = requested_output_names
        request._parameters = parameters_json
        request._model_name = model_name
        request._model_version = model_version
        request._timeout = timeout
        request._preferred_memory = _DEFAULT_PREFERRED_MEMORY
        request._trace = _DEFAULT_TRACE if trace_context is None else InferenceTrace(trace_context)
        request._response_sender = response_sender
        request._cancel_check = cancel_check
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    # -- model-facing API ---------------------------------------------------

    def inputs(self):
        return self._inputs

    def request_id(self):
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def flags(self):
        return self._flags

    def set_flags(self, flags):
        self._flags = _check_uint(flags, "flags")

    def timeout(self):
        return self._timeout

    def parameters(self):
        return self._parameters

    def trace(self):
        return self._trace

    def requested_output_names(self):
        return set(self._requested_output_names)

    def get_response_sender(self):
        sender = self._response_sender
        if sender is None:
            sender = InferenceResponseSender(None, None, self._requested_output_names)
            self._response_sender = sender
        return sender

    def is_cancelled(self):
        if self._cancel_check is not None:
            return bool(self._cancel_check())
        if self._response_sender is not None:
            return self._response_sender.is_cancelled()
        return False

    def set_release_flags(self, flags):
        self._release_flags = _check_uint(flags, "flags")

    def exec(self, decoupled=False):
        return hooks.bls_handler().exec(self, _flag(decoupled))

    def async_exec(self, decoupled=False):
        return hooks.bls_handler().async_exec(self, _flag(decoupled))

    def __repr__(self):
        return "InferenceRequest(model_name=%r, request_id=%r, inputs=%s)" % (
            self._model_name, self._request_id, [t.name() for t in self._inputs])
