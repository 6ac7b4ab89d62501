"""The request/response object model shared by transports, schedulers, backends and BLS.

A tensor is carried in its wire form (`raw`: contiguous little-endian bytes, or
length-prefixed elements for BYTES) because that is what every transport and
the worker IPC read and write; a numpy view is made only when someone asks.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

import numpy as np

from kernel.core import datatypes
from kernel.core.errors import KernelError, invalid_arg


class LateBytes:
    """A tensor's bytes still to be made from what its client sent (a transport's large protobuf
    typed contents): `read()` makes them, on a thread beside the loop before the request is
    admitted (kernel.core.admission, for a request whose `late_inputs` is set). `len()`: what the
    client sent for it, the bytes' size about."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes

    def read(self) -> bytes:
        raise NotImplementedError


class InferTensor:
    """A named tensor: datatype, shape and its bytes in wire form.

    Or, for a GPU tensor passed on without a copy, `device`: a kernel.core.device_memory.DeviceBuffer
    (where the bytes lie in GPU memory); `raw` then copies them to the host on first use.
    """

    __slots__ = ("name", "datatype", "shape", "_raw", "_array", "device")

    def __init__(self, name: str, datatype: str, shape, raw=None, array: np.ndarray | None = None, device=None):
        self.name = name
        self.datatype = datatype
        self.shape = tuple(shape)
        self._raw = raw
        self._array = array
        self.device = device

    @classmethod
    def from_numpy(cls, name: str, array: np.ndarray, datatype: str | None = None) -> "InferTensor":
        if datatype is None:
            datatype = datatypes.numpy_to_datatype(array.dtype)
            if datatype is None:
                raise invalid_arg(f"unsupported numpy dtype {array.dtype} for tensor '{name}'")
        return cls(name, datatype, array.shape, array=array)

    @property
    def raw(self):
        """Bytes-like wire form of the data."""
        if self._raw is None:
            if self.device is not None:  # a GPU tensor: copied to the host only now (KernelError if it is gone)
                self._raw = self.device.to_host()
                return self._raw
            arr = self._array
            if self.datatype == "BYTES":
                self._raw = datatypes.serialize_bytes(np.asarray(arr, dtype=np.object_))
            else:
                arr = np.ascontiguousarray(arr)
                if arr.dtype.byteorder == ">":
                    arr = arr.astype(arr.dtype.newbyteorder("<"))
                self._raw = memoryview(arr).cast("B")
        return self._raw

    @property
    def nbytes(self) -> int:
        if self._raw is None and self.device is not None:
            return self.device.nbytes
        return len(self.raw)

    def as_numpy(self) -> np.ndarray:
        if self._array is None:
            if self.datatype == "BYTES":
                count = datatypes.element_count(self.shape)
                arr = np.empty(count, dtype=np.object_)
                arr[:] = datatypes.deserialize_bytes(self._raw, count)
                self._array = arr.reshape(self.shape)
            else:
                dtype = datatypes.datatype_to_numpy(self.datatype)
                if dtype is None:
                    raise invalid_arg(f"datatype {self.datatype} has no numpy equivalent")
                self._array = np.frombuffer(self.raw, dtype=dtype).reshape(self.shape)
        return self._array

    def __repr__(self) -> str:
        return f"InferTensor({self.name!r}, {self.datatype}, {list(self.shape)})"


class RequestedOutput:
    __slots__ = ("name", "parameters")

    def __init__(self, name: str, parameters: Optional[dict] = None):
        self.name = name
        self.parameters = parameters or {}


class InferResponse:
    """One response to a request. `final` marks the last response of a request."""

    __slots__ = ("model_name", "model_version", "id", "outputs", "parameters", "error", "final")

    def __init__(
        self,
        model_name: str,
        model_version: str,
        id: str = "",
        outputs: Optional[list[InferTensor]] = None,
        parameters: Optional[dict] = None,
        error: Optional[KernelError] = None,
        final: bool = True,
    ):
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.outputs = outputs if outputs is not None else []
        self.parameters = parameters or {}
        self.error = error
        self.final = final

    def output(self, name: str) -> Optional[InferTensor]:
        for t in self.outputs:
            if t.name == name:
                return t
        return None


# Flags as Triton defines them for requests and responses.
REQUEST_FLAG_SEQUENCE_START = 1
REQUEST_FLAG_SEQUENCE_END = 2
RESPONSE_COMPLETE_FINAL = 1

_CORRELATION_ID_MAX = (1 << 64) - 1


def check_correlation_id(value):
    """`value` if it is a correlation id Triton can carry (a uint64 or a string), else KernelError(INVALID_ARG).

    Why in the core: schedulers key sequences by it and backends encode it in
    64 bits; every front validates it with its own protocol's message first,
    and this is the last line for any other caller.
    """
    kind = type(value)
    if kind is str or (kind is int and 0 <= value <= _CORRELATION_ID_MAX):
        return value
    raise invalid_arg(
        f"invalid correlation id {value!r:.40}: a sequence id must be an unsigned 64-bit integer or a string"
    )

ResponseCallback = Callable[[InferResponse], None]


class InferRequest:
    """A request as the core sees it, whatever transport it came from.

    Responses are delivered through `on_response`, set by whoever submits the
    request (a transport, or BLS): one call per response, the last with
    `final=True`. This keeps a single path for plain and decoupled models.
    """

    __slots__ = (
        "model_name",
        "model_version",
        "id",
        "inputs",
        "outputs",
        "parameters",
        "priority",
        "timeout_us",
        "correlation_id",
        "flags",
        "on_response",
        "cancelled",
        "_cancel_callbacks",
        "arrival_ns",
        "on_reschedule",
        "sched",
        "shm",
        "trace",
        "device_outputs",
        "cache_key",
        "late_inputs",
    )

    def __init__(
        self,
        model_name: str,
        model_version: str = "",
        id: str = "",
        inputs: Optional[list[InferTensor]] = None,
        outputs: Optional[list[RequestedOutput]] = None,
        parameters: Optional[dict] = None,
        priority: int = 0,
        timeout_us: int = 0,
        correlation_id: Any = 0,
        flags: int = 0,
    ):
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.inputs = inputs if inputs is not None else []
        self.outputs = outputs  # None: every output the model produces
        self.parameters = parameters or {}
        self.priority = priority
        self.timeout_us = timeout_us
        self.correlation_id = correlation_id
        self.flags = flags
        self.on_response: Optional[ResponseCallback] = None
        self.cancelled = False
        self._cancel_callbacks: Optional[list[Callable[[], None]]] = None
        self.arrival_ns = 0  # time.monotonic_ns() when the core accepted it (statistics)
        # Set by a scheduler that can run a request again when the model releases
        # it with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE (iterative sequences).
        self.on_reschedule: Optional[Callable[["InferRequest"], None]] = None
        self.sched: Any = None  # scheduler-private bookkeeping
        # The client shared-memory windows the request reads or writes
        # (kernel.core.shared_memory.RequestWindows); None when it uses none.
        self.shm: Any = None
        # kernel.observe.trace.Trace when this request was sampled for tracing (set by the transport).
        self.trace: Any = None
        # Outputs whoever gets the responses can take in GPU memory, as CUDA IPC handles, not bytes
        # (kernel.core.device_memory): None for none (the common case), ALL_OUTPUTS, or a set of names.
        self.device_outputs: Any = None
        # Its response-cache key when it was hashed beside the loop before admission (a large request
        # of a caching model, kernel.core.admission); None: the cache computes it on the loop.
        self.cache_key: Any = None
        # Some input's bytes are a LateBytes, made beside the loop before admission (kernel.core.admission).
        self.late_inputs = False

    def input(self, name: str) -> Optional[InferTensor]:
        for t in self.inputs:
            if t.name == name:
                return t
        return None

    def cancel(self) -> None:
        """Mark the request cancelled (client went away) and tell whoever runs it."""
        if self.cancelled:
            return
        self.cancelled = True
        callbacks, self._cancel_callbacks = self._cancel_callbacks, None
        for cb in callbacks or ():
            cb()

    def add_cancel_callback(self, cb: Callable[[], None]) -> None:
        if self.cancelled:
            cb()
            return
        if self._cancel_callbacks is None:
            self._cancel_callbacks = []
        self._cancel_callbacks.append(cb)


def collect_single_response(request: InferRequest) -> "asyncio.Future[InferResponse]":
    """Wire `request.on_response` to a future that resolves with its one response.

    Used by request/response protocols (HTTP infer, unary gRPC). A model that
    sends several responses to such a protocol gets its first non-empty one;
    Triton behaves the same way for decoupled models over unary calls only when
    exactly one response comes, so extra responses are reported as an error.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[InferResponse] = loop.create_future()
    holder: list[InferResponse] = []

    def on_response(response: InferResponse) -> None:
        if fut.done():
            return
        if response.error is not None:
            fut.set_result(response)
            return
        if response.outputs or not response.final:
            holder.append(response)
        if response.final:
            if len(holder) == 1:
                fut.set_result(holder[0])
            elif not holder:
                # A decoupled model that sends only the final flag has no data
                # for a unary protocol; answer with an empty response.
                response.final = True
                fut.set_result(response)
            else:
                err = invalid_arg(
                    "received multiple responses for a request over a protocol that "
                    "supports exactly one; use the streaming gRPC API for decoupled models"
                )
                fut.set_result(InferResponse(response.model_name, response.model_version, response.id, error=err))

    request.on_response = on_response
    return fut
