"""Kernel's implementation of the ``triton_python_backend_utils`` module.

Models written for Triton's Python backend do
``import triton_python_backend_utils as pb_utils`` and use the classes and
helpers below.  Names, signatures, error codes and user-visible messages
follow Triton's documented behaviour so such models run unmodified; the
implementation is Kernel's own and keeps tensors as plain numpy arrays.

Hooks for the Kernel worker process (not part of the model-facing API):

* ``_bls_handler`` -- object serving BLS calls, ``None`` when unavailable.
  Contract::

      exec(request, decoupled) -> InferenceResponse | iterator of responses
      async_exec(request, decoupled) -> awaitable of the same
      load_model(model_name, config, files)            # optional
      unload_model(model_name, unload_dependents)      # optional
      is_model_ready(model_name, model_version) -> bool  # optional

* ``InferenceRequest._server_side(...)`` -- builds the requests handed to
  ``execute``.
* ``InferenceResponseSender(callback, decoupled, requested_output_names)`` --
  the per-request sender; ``callback`` does the actual transport.
* ``Tensor._wrap(name, array, datatype)`` -- tensor from trusted data;
  ``tensor._array`` / ``tensor._datatype`` read it back.
* ``_set_log_verbosity(n)``, ``_configure_logging(...)``, ``_set_model_dir(p)``.
"""

from __future__ import annotations

import copy
import enum
import json
import os
import struct
import sys
import threading
import time

import numpy as np

from . import _dlpack

# ---------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# config.pbtxt data_type name -> numpy type (same table Triton publishes).
TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType enum values.
_TYPE_CODE_OF_DATATYPE = {
    "INVALID": 0,
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}

_NUMPY_OF_TYPE_CODE = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}

# numpy dtype -> KServe datatype, for fixed-size element types.
_DATATYPE_OF_NUMPY = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
}


class TritonModelException(Exception):
    """Exception raised by the utilities (and by models) on failure."""


# ---------------------------------------------------------------------------
# dtype helpers
# ---------------------------------------------------------------------------


def triton_to_numpy_type(data_type):
    """TRITONSERVER_DataType integer -> numpy type; None when unknown."""
    return _NUMPY_OF_TYPE_CODE.get(data_type)


def numpy_to_triton_type(data_type):
    """numpy dtype (or scalar type) -> TRITONSERVER_DataType integer.

    Object, bytes and str dtypes are BYTES (13).  Returns None when the type
    has no Triton equivalent.
    """
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OSU":
        return 13
    datatype = _DATATYPE_OF_NUMPY.get(dtype)
    if datatype is None:
        return None
    return _TYPE_CODE_OF_DATATYPE[datatype]


def triton_string_to_numpy(triton_type_string):
    """'TYPE_FP32' -> np.float32 (KeyError for names not in the table)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def _datatype_of_array(array: np.ndarray) -> str:
    dtype = array.dtype
    datatype = _DATATYPE_OF_NUMPY.get(dtype)
    if datatype is not None:
        return datatype
    if dtype.kind in "OSU":
        return "BYTES"
    raise TritonModelException("NumPy dtype is not supported.")


# ---------------------------------------------------------------------------
# BYTES tensor (de)serialization
# ---------------------------------------------------------------------------

_pack_length = struct.Struct("<I").pack
_unpack_length = struct.Struct("<I").unpack_from


def _element_bytes(item) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    return str(item).encode("utf-8")


def serialize_byte_tensor(input_tensor):
    """Flatten a BYTES (object / bytes / str) array into Triton's wire form.

    Each element becomes a 4-byte little-endian length followed by its bytes,
    in C order.  Non-bytes objects are converted with ``str()`` and encoded as
    UTF-8.  Returns the serialized ``bytes`` (empty for an empty array), or
    None when the array is not a BYTES array.
    """
    if input_tensor.dtype.kind not in "OSU":
        return None
    if input_tensor.size == 0:
        return b""
    parts = []
    append = parts.append
    for item in input_tensor.reshape(-1, order="C").tolist():
        data = _element_bytes(item)
        append(_pack_length(len(data)))
        append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor):
    """Inverse of :func:`serialize_byte_tensor`.

    Returns a 1-D numpy object array of ``bytes`` elements.
    """
    view = memoryview(encoded_tensor).cast("B")
    total = len(view)
    items = []
    append = items.append
    offset = 0
    while offset < total:
        if offset + 4 > total:
            raise TritonModelException(
                "Invalid bytes tensor data: incomplete length field"
            )
        (length,) = _unpack_length(view, offset)
        offset += 4
        end = offset + length
        if end > total:
            raise TritonModelException(
                "Invalid bytes tensor data: string extends beyond buffer"
            )
        append(view[offset:end].tobytes())
        offset = end
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


# ---------------------------------------------------------------------------
# Config / tensor lookup helpers
# ---------------------------------------------------------------------------


def get_input_tensor_by_name(inference_request, name):
    """The request's input Tensor called ``name``, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response, name):
    """The response's output Tensor called ``name``, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config, name):
    """The ``input`` entry of a model-config dict called ``name``, or None."""
    for entry in model_config.get("input", ()):
        if entry["name"] == name:
            return entry
    return None


def get_output_config_by_name(model_config, name):
    """The ``output`` entry of a model-config dict called ``name``, or None."""
    for entry in model_config.get("output", ()):
        if entry["name"] == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config):
    """True when the model-config dict sets a decoupled transaction policy."""
    policy = model_config.get("model_transaction_policy")
    if policy:
        return bool(policy.get("decoupled", False))
    return False


_model_dir = None


def get_model_dir():
    """Directory holding the model's ``model.py`` (the version directory)."""
    if _model_dir is None:
        raise TritonModelException(
            "get_model_dir() is only available once the model is being loaded"
        )
    return _model_dir


def _set_model_dir(path):
    """Worker hook: record the directory returned by get_model_dir()."""
    global _model_dir
    _model_dir = None if path is None else str(path)


# ---------------------------------------------------------------------------
# TritonError
# ---------------------------------------------------------------------------


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
        if isinstance(code, bool) or not isinstance(code, int):
            raise TypeError(
                "TritonError(): 'code' must be a TritonError code, got "
                + type(code).__name__
            )
        try:
            code = _ErrorCode(code)
        except ValueError:
            raise TypeError(
                "TritonError(): unknown error code " + str(int(code))
            ) from None
        self._message = message
        self._code = code

    def message(self):
        return self._message

    def code(self):
        return self._code

    def __repr__(self):
        return "TritonError(%r, TritonError.%s)" % (self._message, self._code.name)


# ---------------------------------------------------------------------------
# Tensor
# ---------------------------------------------------------------------------


def _check_tensor_name(name):
    if not isinstance(name, str):
        raise TypeError("Tensor name must be a str, got " + type(name).__name__)
    if name == "":
        raise TritonModelException("Tensor name cannot be an empty string.")


def _cupy():
    try:
        import cupy  # noqa: PLC0415 - optional, only for GPU tensors
    except ImportError:
        return None
    return cupy


class Tensor:
    """A named tensor.

    ``Tensor(name, numpy_array)`` wraps the array (no copy unless it is not
    C-contiguous, in which case a contiguous copy is taken).  Arrays of
    object, bytes or str dtype are BYTES tensors.

    Internals used by the worker: ``_array`` is the numpy array (for BF16 the
    raw uint16 bits; for GPU tensors a CuPy array) and ``_datatype`` the
    KServe v2 datatype string ("FP32", "BYTES", "BF16", ...).
    """

    __slots__ = ("_name", "_array", "_datatype", "__weakref__")

    def __init__(self, name, numpy_array):
        _check_tensor_name(name)
        if not isinstance(numpy_array, np.ndarray):
            numpy_array = np.asarray(numpy_array)
        datatype = _datatype_of_array(numpy_array)
        if not numpy_array.flags.c_contiguous:
            numpy_array = np.ascontiguousarray(numpy_array)
        self._name = name
        self._array = numpy_array
        self._datatype = datatype

    @classmethod
    def _wrap(cls, name, array, datatype):
        """Worker hook: build a tensor from trusted parts without checks.

        ``array`` must be C-contiguous; for "BYTES" an object array of bytes,
        for "BF16" a uint16 array holding the raw bits, for GPU data a CuPy
        array.
        """
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        return tensor

    def name(self):
        return self._name

    def is_cpu(self):
        return isinstance(self._array, np.ndarray)

    def as_numpy(self):
        if not isinstance(self._array, np.ndarray):
            raise TritonModelException(
                "Tensor is stored in GPU and cannot be converted to NumPy."
            )
        if self._datatype == "BF16":
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use "
                "to_dlpack() and from_dlpack() instead."
            )
        return self._array

    def shape(self):
        return list(self._array.shape)

    def triton_dtype(self):
        """The TRITONSERVER_DataType value of this tensor (e.g. 11 for FP32)."""
        return _TYPE_CODE_OF_DATATYPE[self._datatype]

    def to_dlpack(self):
        if self._datatype == "BYTES":
            raise TritonModelException(
                "DLPack does not have support for string tensors."
            )
        if isinstance(self._array, np.ndarray):
            return _dlpack.export_cpu(self._array, self._datatype)
        return self._array.__dlpack__()

    def __dlpack__(self, *args, **kwargs):
        return self.to_dlpack()

    def __dlpack_device__(self):
        if isinstance(self._array, np.ndarray):
            return (_dlpack.DEVICE_CPU, 0)
        return tuple(self._array.__dlpack_device__())

    @staticmethod
    def from_dlpack(name, tensor):
        """Tensor sharing the memory of a DLPack capsule or DLPack-capable
        object (``__dlpack__`` and ``__dlpack_device__``)."""
        _check_tensor_name(name)
        try:
            return _tensor_from_dlpack(name, tensor)
        except _dlpack.DLPackError as exc:
            raise TritonModelException(str(exc)) from None

    def __repr__(self):
        return "Tensor(name=%r, datatype=%s, shape=%s)" % (
            self._name, self._datatype, list(self._array.shape))


_NOT_CONTIGUOUS = (
    "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are "
    "stored in C-Order are supported."
)


def _unsupported_device(device_type):
    return TritonModelException(
        "DLDevice type " + str(device_type) + " is not support by Python backend."
    )


def _tensor_from_gpu(name, source):
    cupy = _cupy()
    if cupy is None:
        raise TritonModelException(
            "DLPack capsule passed pointer to memory allocated on GPU device, "
            "when GPU is not available"
        )
    array = cupy.from_dlpack(source)
    if not array.flags.c_contiguous:
        raise TritonModelException(_NOT_CONTIGUOUS)
    datatype = _DATATYPE_OF_NUMPY.get(np.dtype(array.dtype))
    if datatype is None:
        raise TritonModelException("Dtype is invalid.")
    return Tensor._wrap(name, array, datatype)


def _tensor_from_dlpack(name, source):
    if _dlpack.is_capsule(source):
        capsule = source
        view = _dlpack.inspect_capsule(capsule)
        if view.device_type == _dlpack.DEVICE_CUDA:
            return _tensor_from_gpu(
                name, _dlpack.CapsuleSource(capsule, view.dlpack_device())
            )
    else:
        if not (hasattr(source, "__dlpack__") and hasattr(source, "__dlpack_device__")):
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack "
                "capsule or have `__dlpack__` and `__dlpack_device__` attributes"
            )
        device_type = int(source.__dlpack_device__()[0])
        if device_type == _dlpack.DEVICE_CUDA:
            return _tensor_from_gpu(name, source)
        if device_type not in (_dlpack.DEVICE_CPU, _dlpack.DEVICE_CUDA_HOST):
            raise _unsupported_device(device_type)
        if isinstance(source, np.ndarray):
            # Share the array directly: numpy refuses to export read-only
            # arrays through DLPack, and there is nothing to convert.
            if not source.flags.c_contiguous:
                raise TritonModelException(_NOT_CONTIGUOUS)
            datatype = _DATATYPE_OF_NUMPY.get(source.dtype)
            if datatype is None:
                raise TritonModelException("Dtype is invalid.")
            return Tensor._wrap(name, source, datatype)
        if isinstance(source, Tensor):
            if source._datatype == "BYTES":
                raise TritonModelException(
                    "DLPack does not have support for string tensors."
                )
            return Tensor._wrap(name, source._array, source._datatype)
        try:
            capsule = source.__dlpack__(stream=None)
        except TypeError:  # producers predating the stream argument
            capsule = source.__dlpack__()
        view = _dlpack.inspect_capsule(capsule)

    if view.device_type not in (_dlpack.DEVICE_CPU, _dlpack.DEVICE_CUDA_HOST):
        raise _unsupported_device(view.device_type)
    if not _dlpack.is_c_contiguous(view.shape, view.strides):
        raise TritonModelException(_NOT_CONTIGUOUS)
    datatype = _dlpack.datatype_from_dlpack(view.code, view.bits, view.lanes)
    if datatype is None:
        raise TritonModelException("Dtype is invalid.")
    array = _dlpack.consume_cpu(view, _dlpack.STORAGE_DTYPE[datatype])
    return Tensor._wrap(name, array, datatype)


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------


def _parameters_to_json(parameters):
    if parameters is None:
        return "{}"
    if not isinstance(parameters, dict):
        raise TritonModelException(
            "Expect dict, got " + str(type(parameters))
        )
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                "Expect parameters keys to have type str, found type "
                + str(type(key))
            )
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                "Expect parameters values to have type bool/int/str, found type "
                + str(type(value))
            )
    return json.dumps(parameters)


# ---------------------------------------------------------------------------
# InferenceResponse
# ---------------------------------------------------------------------------


class InferenceResponse:
    """``InferenceResponse(output_tensors=[], error=None, parameters=None)``.

    ``parameters`` is a dict with str keys and bool/int/str values;
    ``parameters()`` returns it as a JSON string.
    """

    __slots__ = ("_output_tensors", "_error", "_parameters")

    def __init__(self, output_tensors=None, error=None, parameters=None):
        if output_tensors is None:
            tensors = []
        elif isinstance(output_tensors, (str, bytes)):
            raise TypeError("output_tensors must be a list of Tensor objects")
        else:
            tensors = list(output_tensors)
        for tensor in tensors:
            if tensor is None:
                raise TritonModelException(
                    "Output tensor for inference response should not be empty."
                )
            if not isinstance(tensor, Tensor):
                raise TypeError(
                    "output_tensors must contain Tensor objects, found "
                    + type(tensor).__name__
                )
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(
                "error must be a TritonError or None, found " + type(error).__name__
            )
        self._output_tensors = tensors
        self._error = error
        self._parameters = _parameters_to_json(parameters)

    @classmethod
    def _server_side(cls, output_tensors, error=None, parameters_json="{}"):
        """Worker hook: a response from already-validated parts (BLS results).

        ``parameters_json`` is the JSON string ``parameters()`` returns.
        """
        response = cls.__new__(cls)
        response._output_tensors = list(output_tensors)
        response._error = error
        response._parameters = parameters_json
        return response

    def output_tensors(self):
        return self._output_tensors

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return self._parameters

    def _prune_outputs(self, requested_output_names):
        """Worker hook: drop outputs the client did not request (in place)."""
        self._output_tensors = [
            t for t in self._output_tensors if t._name in requested_output_names
        ]

    def __repr__(self):
        return "InferenceResponse(outputs=%s, error=%r)" % (
            [t.name() for t in self._output_tensors], self._error)


# ---------------------------------------------------------------------------
# Response sender
# ---------------------------------------------------------------------------


class InferenceResponseSender:
    """Sends responses for one request (``request.get_response_sender()``).

    Created by the worker::

        InferenceResponseSender(callback, decoupled, requested_output_names=None)

    * ``callback`` -- object with ``send(response, flags)`` (``response`` is an
      InferenceResponse or None, ``flags`` 0 or
      TRITONSERVER_RESPONSE_COMPLETE_FINAL; outputs are already pruned) and
      ``is_cancelled() -> bool``.  May be None for a sender that cannot send.
    * ``decoupled`` -- whether the model is decoupled.  None means "unknown"
      (requests a model builds for BLS); sending then fails, as in Triton.
    * ``requested_output_names`` -- when given, outputs not named are removed
      from a response before it reaches ``callback``.

    Validation (flags, one-response rule for non-decoupled models, closed
    sender) happens here and raises TritonModelException with Triton's
    messages.  The worker applies the same rules to responses returned from
    ``execute`` through ``_update_state(response, FINAL)``.
    """

    __slots__ = ("_callback", "_decoupled", "_requested", "_closed", "_sent", "_lock")

    def __init__(self, callback, decoupled, requested_output_names=None):
        self._callback = callback
        self._decoupled = decoupled
        self._requested = (
            None if requested_output_names is None else frozenset(requested_output_names)
        )
        self._closed = False
        self._sent = 0
        self._lock = threading.Lock()

    def send(self, response=None, flags=0):
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(
                "send(): 'response' must be an InferenceResponse or None, found "
                + type(response).__name__
            )
        if flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL and flags != 0:
            raise TritonModelException(
                "Unable to send response. Unsupported flag provided."
            )
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response "
                "flags is set to zero."
            )
        self._update_state(response, flags)
        if response is not None and self._requested is not None:
            response._prune_outputs(self._requested)
        self._callback.send(response, flags)

    def is_cancelled(self):
        if self._callback is None:
            return False
        return bool(self._callback.is_cancelled())

    # -- worker hooks -------------------------------------------------------

    def _update_state(self, response, flags):
        """Account for one response about to be delivered; raises when the
        delivery would break the sender's rules."""
        if self._decoupled is None:
            raise TritonModelException(
                "Unable to send response. Response sender has no reference to "
                "the decoupled state of the model."
            )
        with self._lock:
            if not self._decoupled:
                if response is not None and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot "
                        "send more than one response."
                    )
                if (
                    response is None
                    and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    and self._sent == 0
                ):
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot "
                        "send complete final before sending a response."
                    )
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True
            self._sent += 1

    def _close(self):
        """Refuse further sends (e.g. after execute failed)."""
        with self._lock:
            self._closed = True

    def _is_closed(self):
        return self._closed

    def _responses_sent(self):
        return self._sent


# ---------------------------------------------------------------------------
# InferenceRequest and friends
# ---------------------------------------------------------------------------


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
        if isinstance(preferred_memory_type, bool) or not isinstance(
            preferred_memory_type, int
        ):
            raise TypeError("preferred_memory_type must be a memory type constant")
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

_bls_handler = None


def _bls():
    handler = _bls_handler
    if handler is None:
        raise TritonModelException("BLS is not available in this process")
    return handler


def _check_uint(value, what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(what + " must be an int, got " + type(value).__name__)
    if value < 0:
        raise TypeError(what + " must not be negative")
    return value


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
        if isinstance(correlation_id, str):
            pass
        elif isinstance(correlation_id, int):
            _check_uint(correlation_id, "correlation_id")
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
        self._parameters = _parameters_to_json(parameters)
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
        if not isinstance(decoupled, bool):
            raise TypeError("decoupled must be a bool")
        return _bls().exec(self, decoupled)

    def async_exec(self, decoupled=False):
        if not isinstance(decoupled, bool):
            raise TypeError("decoupled must be a bool")
        return _bls().async_exec(self, decoupled)

    def __repr__(self):
        return "InferenceRequest(model_name=%r, request_id=%r, inputs=%s)" % (
            self._model_name, self._request_id, [t.name() for t in self._inputs])


# ---------------------------------------------------------------------------
# Model control (served by the BLS handler)
# ---------------------------------------------------------------------------


def _model_control(method):
    handler = _bls()
    function = getattr(handler, method, None)
    if function is None:
        raise TritonModelException(
            "The model loading API is not available in this process"
        )
    return function


def load_model(model_name, config="", files=None):
    """Load (or reload) ``model_name``; ``config`` is an optional JSON model
    config override and ``files`` maps "file:<path>" to bytes content."""
    if not isinstance(model_name, str) or not isinstance(config, str):
        raise TypeError("model_name and config must be str")
    return _model_control("load_model")(model_name, config, files)


def unload_model(model_name, unload_dependents=False):
    if not isinstance(model_name, str):
        raise TypeError("model_name must be a str")
    return _model_control("unload_model")(model_name, bool(unload_dependents))


def is_model_ready(model_name, model_version=""):
    if not isinstance(model_name, str) or not isinstance(model_version, str):
        raise TypeError("model_name and model_version must be str")
    return bool(_model_control("is_model_ready")(model_name, model_version))


# ---------------------------------------------------------------------------
# Logger
# ---------------------------------------------------------------------------


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVEL_LETTER = {
    LogLevel.INFO: "I",
    LogLevel.WARNING: "W",
    LogLevel.ERROR: "E",
    LogLevel.VERBOSE: "I",
}

_log_settings = {
    "verbose": 0,
    "info": True,
    "warning": True,
    "error": True,
    "format": "default",
    "escape": os.environ.get("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "1") != "0",
    "sink": None,
}


def _set_log_verbosity(level):
    """Worker hook: verbose log level (``--log-verbose``); >0 shows
    ``log_verbose`` messages."""
    _log_settings["verbose"] = int(level)


def _configure_logging(verbose=None, info=None, warning=None, error=None,
                       log_format=None, escape=None, sink=None):
    """Worker hook: mirror the server's log settings.

    ``log_format`` is "default" or "ISO8601"; ``escape`` toggles JSON quoting
    of messages; ``sink`` is a callable receiving each finished line (without
    newline) instead of it being written to stderr (``sink=False`` goes back
    to stderr).  Arguments left as None keep their current value.
    """
    if verbose is not None:
        _log_settings["verbose"] = int(verbose)
    for key, value in (("info", info), ("warning", warning), ("error", error),
                       ("escape", escape)):
        if value is not None:
            _log_settings[key] = bool(value)
    if log_format is not None:
        if log_format not in ("default", "ISO8601"):
            raise ValueError("log_format must be 'default' or 'ISO8601'")
        _log_settings["format"] = log_format
    if sink is False:
        _log_settings["sink"] = None
    elif sink is not None:
        _log_settings["sink"] = sink


def _level_enabled(level):
    if level == LogLevel.VERBOSE:
        return _log_settings["verbose"] > 0
    if level == LogLevel.WARNING:
        return _log_settings["warning"]
    if level == LogLevel.ERROR:
        return _log_settings["error"]
    return _log_settings["info"]


def _format_log_line(level, filename, lineno, message, now=None):
    if now is None:
        now = time.time()
    seconds = int(now)
    micros = int((now - seconds) * 1_000_000)
    utc = time.gmtime(seconds)
    letter = _LEVEL_LETTER.get(level, "I")
    if _log_settings["escape"]:
        message = json.dumps(message, ensure_ascii=False)
    location = "%d %s:%d] %s" % (
        os.getpid(), os.path.basename(filename), lineno, message)
    if _log_settings["format"] == "ISO8601":
        return "%04d-%02d-%02dT%02d:%02d:%02dZ %s %s" % (
            utc.tm_year, utc.tm_mon, utc.tm_mday, utc.tm_hour, utc.tm_min,
            utc.tm_sec, letter, location)
    return "%s%02d%02d %02d:%02d:%02d.%06d %s" % (
        letter, utc.tm_mon, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
        micros, location)


def _emit(level, message, depth):
    if not _level_enabled(level):
        return
    frame = sys._getframe(depth + 1)
    line = _format_log_line(level, frame.f_code.co_filename, frame.f_lineno,
                            str(message))
    sink = _log_settings["sink"]
    if sink is not None:
        sink(line)
        return
    stream = sys.stderr
    if stream is not None:
        stream.write(line + "\n")
        stream.flush()


class Logger:
    """Writes messages to the server log, tagged with the caller's file and
    line.  All methods are static: ``pb_utils.Logger.log_info("...")``."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message, level=LogLevel.INFO):
        _emit(LogLevel(level), message, 1)

    @staticmethod
    def log_info(message):
        _emit(LogLevel.INFO, message, 1)

    @staticmethod
    def log_warn(message):
        _emit(LogLevel.WARNING, message, 1)

    @staticmethod
    def log_error(message):
        _emit(LogLevel.ERROR, message, 1)

    @staticmethod
    def log_verbose(message):
        _emit(LogLevel.VERBOSE, message, 1)


# ---------------------------------------------------------------------------
# ModelConfig (auto_complete_config)
# ---------------------------------------------------------------------------


def _same_dims(a, b):
    try:
        return [int(d) for d in a] == [int(d) for d in b]
    except (TypeError, ValueError):
        return a == b


class ModelConfig:
    """The model configuration handed to ``auto_complete_config``.

    Built from the config as a JSON string or dict.  ``as_dict()`` gives
    read access; the setters below complete the config and refuse changes
    that contradict what the configuration file already states.  The worker
    reads the result from ``_model_config``.
    """

    def __init__(self, model_config):
        if isinstance(model_config, (str, bytes, bytearray)):
            self._model_config = json.loads(model_config)
        elif isinstance(model_config, dict):
            self._model_config = copy.deepcopy(model_config)
        else:
            raise TypeError("ModelConfig expects a JSON string or a dict")

    def _name(self):
        return str(self._model_config.get("name", ""))

    def as_dict(self):
        return self._model_config

    def set_max_batch_size(self, max_batch_size):
        current = self._model_config.get("max_batch_size", 0)
        if current > max_batch_size:
            raise ValueError(
                "configuration specified max_batch_size " + str(current)
                + ", but in auto-complete-config function for model '"
                + self._name() + "' specified max_batch_size "
                + str(max_batch_size)
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    "Configuration specified scheduling_choice as '" + other
                    + "', but auto-complete-config function for model '"
                    + self._name()
                    + "' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def _add_tensor(self, kind, tensor, allowed, allowed_text):
        config_name = self._name()
        for key in tensor:
            if key not in allowed:
                raise ValueError(
                    kind + " '" + str(tensor.get("name", "")) + "' in "
                    "auto-complete-config function for model '" + config_name
                    + "' contains property other than " + allowed_text + "."
                )
        if "name" not in tensor:
            raise ValueError(
                kind + " in auto-complete-config function for model '"
                + config_name + "' is missing 'name' property."
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    kind + " '" + tensor["name"] + "' in auto-complete-config "
                    "function for model '" + config_name + "' is missing '"
                    + key + "' property."
                )

        entries = self._model_config.setdefault(kind, [])
        for existing in entries:
            if existing.get("name") != tensor["name"]:
                continue
            existing_type = existing.get("data_type", "TYPE_INVALID")
            if existing_type != "TYPE_INVALID" and existing_type != tensor["data_type"]:
                raise ValueError(
                    "unable to load model '" + config_name
                    + "', configuration expects datatype " + existing_type
                    + " for " + kind + " '" + tensor["name"]
                    + "', model provides " + tensor["data_type"]
                )
            existing_dims = existing.get("dims")
            if existing_dims and not _same_dims(existing_dims, tensor["dims"]):
                raise ValueError(
                    "model '" + config_name + "', tensor '" + tensor["name"]
                    + "': the model expects dims " + str(tensor["dims"])
                    + " but the model configuration specifies dims "
                    + str(existing_dims)
                )
            if (
                kind == "input"
                and "optional" in existing
                and "optional" in tensor
                and existing["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    "model '" + config_name + "', tensor '" + tensor["name"]
                    + "': the model expects optional " + str(tensor["optional"])
                    + " but the model configuration specifies optional "
                    + str(existing["optional"])
                )
            existing["data_type"] = tensor["data_type"]
            existing["dims"] = tensor["dims"]
            if kind == "input" and "optional" in tensor:
                existing["optional"] = tensor["optional"]
            return
        entries.append(tensor)

    def add_input(self, input):  # noqa: A002 - Triton's parameter name
        self._add_tensor(
            "input", input, ("name", "data_type", "dims", "optional"),
            "'name', 'data_type', 'dims' and 'optional'",
        )

    def add_output(self, output):
        self._add_tensor(
            "output", output, ("name", "data_type", "dims"),
            "'name', 'data_type' and 'dims'",
        )

    def set_model_transaction_policy(self, transaction_policy_dict):
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config "
                    "function for model '" + self._name()
                    + "' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config "
                    "for model '" + self._name() + "', which is already set to '"
                    + str(policy["decoupled"]) + "'."
                )
            policy["decoupled"] = wanted


# ---------------------------------------------------------------------------
# Custom metrics (MetricFamily / Metric); see _metrics.py. The worker installs
# ``_metrics_handler`` to forward metric operations to the server process.
# ---------------------------------------------------------------------------

_metrics_handler = None

from ._metrics import Metric, MetricFamily, MetricKind  # noqa: E402
