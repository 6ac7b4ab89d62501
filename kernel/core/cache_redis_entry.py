"""A Redis cache entry's bytes: how a response is written, and how an entry is read and checked
before it answers anyone.

Redis is shared and outlives every server: what a key holds may come from another Kernel version,
be cut short, be replaced while it is read in pieces, or be written by someone else altogether. An
entry is used only when all of these hold, else it is rejected (kernel.core.cache_redis counts
it, logs the first, and the request is computed; its response then replaces the entry):

- it starts with this format's tag and its digest (BLAKE2b of the rest) matches: a value read in
  pieces (kernel.core.cache_redis_reads) that changed between two pieces fails here;
- the rest decodes as [all_outputs, parameters (JSON object or empty), [[name, datatype, shape,
  bytes], ...]], each name once, each datatype one Kernel knows, dimensions >= 0;
- each tensor's bytes agree with its shape: element count x element size, or for BYTES exactly
  that many well-formed length-prefixed elements;
- (`fits`, per model) every output is one of the model's configured outputs, with its datatype.

A response is stored only when it fits its model the same way, so an entry this server wrote is
never rejected by it. Decoding does not copy the tensors' bytes: they stay views of the value
read, one buffer per entry.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Annotated, Optional

import msgspec

from kernel.core import datatypes
from kernel.core.cache_entry import stored_answer
from kernel.core.request import InferTensor

MAGIC = b"KRC\x02"
DIGEST_BYTES = 16
HEADER_BYTES = len(MAGIC) + DIGEST_BYTES

_encoder = msgspec.msgpack.Encoder()
_unpack_len = struct.Struct("<I").unpack_from


class BadEntry(ValueError):
    """An entry that must not answer: the message says why (for the log)."""


class _Tensor(msgspec.Struct, array_like=True):
    name: str
    datatype: str
    shape: list[Annotated[int, msgspec.Meta(ge=0)]]
    data: memoryview


class _Doc(msgspec.Struct, array_like=True):
    all_outputs: bool
    parameters: bytes
    outputs: list[_Tensor]


_decoder = msgspec.msgpack.Decoder(_Doc)


class Stored:
    """A decoded entry, answering as the local cache's entries do."""

    __slots__ = ("outputs", "parameters", "all_outputs", "nbytes")

    def __init__(self, outputs: list[InferTensor], parameters: Optional[dict], all_outputs: bool, nbytes: int):
        self.outputs = outputs
        self.parameters = parameters
        self.all_outputs = all_outputs
        self.nbytes = nbytes

    def answer(self, requested) -> Optional[list[InferTensor]]:
        return stored_answer(self.outputs, self.all_outputs, requested)


def payload_size(outputs) -> int:
    """About what an entry for these outputs takes (before it is encoded): their bytes."""
    return sum(len(t.raw) for t in outputs)


def encode(outputs, parameters: Optional[dict], all_outputs: bool) -> bytearray:
    """An entry's value, its digest still to be filled in by `seal` (off the loop when it is large).
    Copies the output bytes: the response's buffers are reused once it is sent."""
    params = msgspec.json.encode(parameters) if parameters else b""
    value = bytearray(HEADER_BYTES)
    value[:len(MAGIC)] = MAGIC
    _encoder.encode_into([all_outputs, params, [(t.name, t.datatype, list(t.shape), t.raw) for t in outputs]],
                         value, HEADER_BYTES)
    return value


def seal(value: bytearray) -> bytearray:
    """Write the digest of the value's payload into its header."""
    value[len(MAGIC):HEADER_BYTES] = _digest(memoryview(value)[HEADER_BYTES:])
    return value


def _digest(data) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def decode(value) -> Stored:
    """The entry in `value` (bytes-like), checked on its own; BadEntry when it is not usable.
    Linear in the value's size (the digest, and for BYTES outputs a walk over their elements)."""
    view = memoryview(value)
    if len(view) < HEADER_BYTES or view[:len(MAGIC)] != MAGIC:
        raise BadEntry("it is not an entry of this format (another program's, or another Kernel version's)")
    payload = view[HEADER_BYTES:]
    if _digest(payload) != view[len(MAGIC):HEADER_BYTES]:
        raise BadEntry("its digest does not match its bytes (cut short, changed while read, or forged)")
    try:
        doc = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadEntry(f"it does not decode: {exc}") from None
    params = None
    if doc.parameters:
        try:
            params = msgspec.json.decode(doc.parameters)
        except msgspec.DecodeError:
            params = None
        if not isinstance(params, dict):
            raise BadEntry("its response parameters are not a JSON object")
    outputs = []
    names = set()
    for t in doc.outputs:
        if t.name in names:
            raise BadEntry(f"it holds output '{t.name}' twice")
        names.add(t.name)
        _check_bytes(t)
        outputs.append(InferTensor(t.name, t.datatype, t.shape, raw=t.data))
    return Stored(outputs, params, doc.all_outputs, len(view))


def _check_bytes(t: _Tensor) -> None:
    count = datatypes.element_count(t.shape)
    data = t.data
    if t.datatype == "BYTES":
        if not _bytes_elements_ok(data, count):
            raise BadEntry(f"BYTES output '{t.name}' of shape {t.shape} is not {count} well-formed elements")
        return
    size = datatypes.ELEMENT_SIZE.get(t.datatype)
    if size is None:
        raise BadEntry(f"output '{t.name}' has an unknown datatype {t.datatype!r:.40}")
    if len(data) != count * size:
        raise BadEntry(f"{t.datatype} output '{t.name}' of shape {t.shape} needs {count * size} bytes, "
                       f"the entry holds {len(data)}")


def _bytes_elements_ok(data: memoryview, count: int) -> bool:
    """`data` is exactly `count` length-prefixed elements (4-byte little-endian length, then bytes)."""
    end = len(data)
    if count * 4 > end:
        return False
    offset = 0
    for _ in range(count):
        if offset + 4 > end:
            return False
        offset += 4 + _unpack_len(data, offset)[0]
    return offset == end


def fits(model, outputs) -> Optional[str]:
    """Why these outputs cannot be the model's answer (None: they can): an output the model does not
    configure, or one with another datatype than its config's. A model without configured outputs
    (auto-complete left none) takes any."""
    if not model.check_outputs:
        return None
    specs = model.outputs
    for t in outputs:
        spec = specs.get(t.name)
        if spec is None:
            return f"output '{t.name}' is not an output of model '{model.name}'"
        if t.datatype != spec.datatype:
            return f"output '{t.name}' is {t.datatype!r:.40}; model '{model.name}' configures {spec.datatype}"
    return None
