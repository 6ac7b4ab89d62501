"""The remote-binding protocol: how a process holding callables (kernel.triton.RemoteTriton) serves
them as models of a server running in another process on the same host.

The binding process is a worker that dials in instead of being spawned: it connects to the
server's Unix socket, says which models it binds (their generated config.pbtxt and output specs),
and then answers inference calls for them. Messages are msgspec Structs, msgpack-encoded, each
behind a 4-byte big-endian length; tensors ride inline. Both sides import only this module and
kernel.proxy.remote_socket, so it holds nothing but data types and the framing.

The socket is named after the server's HTTP and gRPC ports, so `RemoteTriton(url="localhost:8000")`
finds the server it names; kernel.proxy.remote_socket says in which private per-user folder, and
checks that the process at the other end runs as the same user. A Unix socket cannot be reached
from another host.
"""

from __future__ import annotations

import struct
from typing import Any, Dict, List, Optional, Union

import msgspec
import numpy as np

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1 << 31  # a frame claiming more is a broken peer, not a tensor
_LENGTH = struct.Struct(">I")


# ---- messages ------------------------------------------------------------------------------------


class Array(msgspec.Struct, array_like=True):
    """A numpy array: dtype string, shape and bytes; object (bytes) arrays as a list of items."""

    dtype: str
    shape: List[int]
    data: Union[bytes, List[bytes]]


class RequestData(msgspec.Struct, array_like=True):
    inputs: Dict[str, Array]
    parameters: Dict[str, Any]
    requested_outputs: Optional[List[str]]


class Hello(msgspec.Struct, tag=True):
    """Binding process -> server, first: who is dialling in."""

    pid: int
    protocol: int = PROTOCOL_VERSION


class Welcome(msgspec.Struct, tag=True):
    """Server -> binding process: the connection is accepted (or why not)."""

    error: Optional[str] = None


class Bind(msgspec.Struct, tag=True):
    """Serve a model whose callables live in the binding process (one per instance)."""

    name: str
    version: int
    config_pbtxt: str
    outputs: List[Any]  # [name, numpy dtype string, shape]
    batching: bool
    decoupled: bool
    strict: bool
    instances: int


class Unbind(msgspec.Struct, tag=True):
    name: str


class Answer(msgspec.Struct, tag=True):
    """Server -> binding process: the Bind or Unbind of `name` is done (error: why it failed)."""

    name: str
    error: Optional[str] = None


class Infer(msgspec.Struct, tag=True):
    """Server -> binding process: run instance `instance` of model `name` on one batch."""

    call: int
    name: str
    instance: int
    requests: List[RequestData]


class Result(msgspec.Struct, tag=True):
    """One list of responses (a return value, or one yield of a decoupled callable)."""

    call: int
    responses: List[Dict[str, Array]]


class Done(msgspec.Struct, tag=True):
    """The call has ended; every Result has been sent."""

    call: int


class Failed(msgspec.Struct, tag=True):
    """The callable raised; `message` carries its traceback."""

    call: int
    message: str
    unrecoverable: bool = False


class Cancel(msgspec.Struct, tag=True):
    """Server -> binding process: nobody waits for call `call` any more (its requests were cancelled)."""

    call: int


Message = Union[Hello, Welcome, Bind, Unbind, Answer, Infer, Result, Done, Failed, Cancel]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def frame(message: Message) -> bytes:
    body = _encoder.encode(message)
    return _LENGTH.pack(len(body)) + body


def decode(body: bytes) -> Message:
    return _decoder.decode(body)


def frame_length(header: bytes) -> int:
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {length} bytes is over the limit of {MAX_FRAME_BYTES}")
    return length


HEADER_BYTES = _LENGTH.size


# ---- arrays ----------------------------------------------------------------------------------------


def to_array(value: np.ndarray) -> Array:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"expected a numpy array, got {type(value).__name__}")
    if value.dtype.kind == "O":
        return Array("|O", list(value.shape), [_item_bytes(x) for x in value.ravel()])
    value = np.ascontiguousarray(value)
    return Array(value.dtype.str, list(value.shape), value.tobytes())


def _item_bytes(item: Any) -> bytes:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, str):
        return item.encode()
    raise TypeError(f"object arrays may hold bytes only, got {type(item).__name__}")


def from_array(array: Array, writable: bool = True) -> np.ndarray:
    shape = tuple(array.shape)
    if array.dtype == "|O":
        out = np.empty(len(array.data), dtype=object)
        out[:] = list(array.data)
        return out.reshape(shape)
    dtype = np.dtype(array.dtype)
    if dtype.itemsize == 0 or not array.data:
        return np.zeros(shape, dtype)
    data = bytearray(array.data) if writable else array.data
    return np.frombuffer(data, dtype).reshape(shape)
