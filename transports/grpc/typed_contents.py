"""An input's typed `contents` (InferTensorContents: fp32_contents, bytes_contents, ...) turned into
its wire bytes beside the event loop, in pieces.

Why: protobuf parses a repeated field holding the GIL (~19 ns per bytes_contents element, upb), and
making the tensor's bytes from the parsed list walks it element by element (~170 ns per BYTES
element, ~60 ns per number in np.array): 4 Mi empty bytes_contents (an 8 MB message) held a front's
loop 0.75 s, and the message limit is 2 GiB. So a large ModelInfer message has each large `contents`
cut out before protobuf parses the rest (`cut_contents`, used by codec.split_raw_inputs), and the
input's bytes are made later by `LateContents.read`, on a thread, before the request is admitted
(kernel.core.admission): bytes_contents elements are walked here (Python, which hands the GIL to
the loop every switch interval), everything else is parsed by protobuf in pieces of at most
PIECE_BYTES (a packed list cut at element boundaries), each piece one short call. Merging the
pieces' repeated fields is what protobuf does with a message's repeated fields anyway; the checks
and their words are contents_bytes', shared with small contents parsed the usual way (codec.py).
"""

from __future__ import annotations

import struct
from typing import Optional

import numpy as np
from google.protobuf.message import DecodeError

from kernel.core import datatypes
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import LateBytes
from kernel.transports.grpc.protos import grpc_service_pb2 as pb
from kernel.transports.grpc.wire import PARSE_ERROR

# contents field -> the datatype it carries natively (its numbers' numpy dtype: kernel.core.datatypes)
CONTENTS_FIELDS = (
    ("bool_contents", "BOOL"),
    ("int_contents", "INT32"),
    ("int64_contents", "INT64"),
    ("uint_contents", "UINT32"),
    ("uint64_contents", "UINT64"),
    ("fp32_contents", "FP32"),
    ("fp64_contents", "FP64"),
    ("bytes_contents", "BYTES"),
)
_NATIVE = dict(CONTENTS_FIELDS)
# Narrow integer types travel in the 32-bit lists.
_NARROWED = {"int_contents": ("INT8", "INT16"), "uint_contents": ("UINT8", "UINT16")}


def contents_bytes(name: str, datatype: str, model_name: str, pieces_of) -> bytes:
    """An input's bytes in wire form from its typed contents, with Triton's refusals.

    `pieces_of(field)`: that field's elements in pieces, in order, or nothing: protobuf lists (a
    message parsed whole: one piece each), or, for contents made beside the loop, numpy arrays
    already of the field's type and bytes_contents already in wire form."""
    raw: Optional[bytes] = None
    for field, native in CONTENTS_FIELDS:
        pieces = pieces_of(field)
        if not pieces:
            continue
        carried = native
        if datatype in _NARROWED.get(field, ()):
            carried = datatype
        if raw is not None:
            raise KernelError(ErrorCode.INVALID_ARG,
                              f"unexpected explicit tensor data for input tensor '{name}' for model '{model_name}', "
                              "binary data was already supplied.")
        if carried != datatype:
            raise KernelError(ErrorCode.INVALID_ARG,
                              f"unexpected explicit tensor data for input tensor '{name}' for model '{model_name}' of "
                              f"type '{carried}', expected datatype '{datatype}'")
        if native == "BYTES":
            raw = b"".join(p if type(p) is bytes else b"".join(_LEN(len(v)) + v for v in p) for p in pieces)
        else:
            dtype = datatypes.datatype_to_numpy(native)
            arrays = [np.asarray(p, dtype=dtype) for p in pieces]
            array = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            raw = array.astype(datatypes.datatype_to_numpy(carried), copy=False).tobytes()
    return b"" if raw is None else raw


# A contents field at least this large is cut out of its message and made into bytes beside the loop.
CUT_BYTES = 64 * 1024
# What one protobuf call parses at most.
PIECE_BYTES = 256 * 1024

_BYTES_FIELD = 8  # InferTensorContents.bytes_contents
_FIXED_WIDTH = {6: 4, 7: 8}  # fp32_contents, fp64_contents: packed as 4- and 8-byte little-endian
_VARINT_FIELDS = (1, 2, 3, 4, 5)  # bool, int, int64, uint, uint64 contents: packed varints
_LEN = struct.Struct("<I").pack


def read_varint(view, pos: int) -> tuple[int, int]:
    """The varint at `pos` and where it ends; IndexError past the end of `view` or past 10 bytes."""
    value = 0
    shift = 0
    while True:
        b = view[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


_VARINT_1 = [bytes([i]) for i in range(128)]


def encode_varint(n: int) -> bytes:
    """n as a protobuf varint (a negative one as its 64-bit two's complement, as protobuf writes an
    int64); also codec's encoder of ModelInferResponse fields, where most are one byte."""
    if n < 128:
        return _VARINT_1[n] if n >= 0 else encode_varint(n & 0xFFFFFFFFFFFFFFFF)
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def walk_fields(view):
    """The fields of the protobuf serialization in `view`, in order, as (where the tag starts, the
    tag, where the value starts, where the field ends): a LEN field's value is its payload, after
    its length. A group (wire types 3 and 4, which these walks leave to protobuf) ends the walk as
    (where its tag starts, its tag, -1, -1). IndexError when a field runs past the end."""
    n = len(view)
    pos = 0
    while pos < n:
        tag_at = pos
        tag, pos = read_varint(view, pos)
        kind = tag & 7
        if kind == 2:
            size, start = read_varint(view, pos)
            pos = start + size
        elif kind == 0:
            start = pos
            pos = read_varint(view, pos)[1]
        elif kind == 1:
            start = pos
            pos += 8
        elif kind == 5:
            start = pos
            pos += 4
        else:
            yield tag_at, tag, -1, -1
            return
        if pos > n:
            raise IndexError("field past the end")
        yield tag_at, tag, start, pos


def cut_contents(sub) -> Optional[tuple[bytes, memoryview]]:
    """An InferInputTensor's serialization (a view) without its `contents` field, and that field's
    payload; None when it has no contents field of CUT_BYTES or more, or has it more than once
    (protobuf then merges them; that rare message is left to protobuf whole)."""
    found = None
    try:
        for tag_at, tag, start, end in walk_fields(sub):
            if start < 0:
                return None
            if tag == 0x2A:  # field 5, contents
                if found is not None:
                    return None
                found = (tag_at, start, end)
    except IndexError:
        return None
    if found is None or found[2] - found[1] < CUT_BYTES:
        return None
    tag_at, start, end = found
    return b"".join((sub[:tag_at], sub[end:])), sub[start:end]


class LateContents(LateBytes):
    """An input's cut-out `contents`, made into its wire bytes by `read` (on a thread)."""

    __slots__ = ("payload", "name", "datatype", "model_name")

    def __init__(self, payload: memoryview, name: str, datatype: str, model_name: str):
        super().__init__(len(payload))
        self.payload = payload
        self.name = name
        self.datatype = datatype
        self.model_name = model_name

    def read(self) -> bytes:
        try:
            fields = _parse(self.payload)
        except (DecodeError, ValueError, IndexError):
            raise KernelError(ErrorCode.INTERNAL, PARSE_ERROR) from None
        return contents_bytes(self.name, self.datatype, self.model_name,
                              fields.get)


def _parse(payload) -> dict[str, list]:
    """The InferTensorContents in `payload`: for each field with elements, its pieces in order
    (bytes_contents as wire bytes, length-prefixed elements; numbers as numpy arrays)."""
    fields: dict[str, list] = {}
    names = {f.number: f.name for f in pb.InferTensorContents.DESCRIPTOR.fields}
    piece: list = []  # whole fields of the next protobuf piece
    piece_bytes = 0
    view = memoryview(payload)
    wire = []  # bytes_contents elements in wire form, flushed every PIECE_BYTES
    wire_bytes = 0

    def flush_piece() -> None:
        nonlocal piece, piece_bytes
        if piece:
            parsed = pb.InferTensorContents.FromString(b"".join(piece))
            for number, name in names.items():
                if number == _BYTES_FIELD:
                    values = parsed.bytes_contents  # (only a bytes_contents with a wrong wire type reaches here: dropped)
                    if values:
                        fields.setdefault(name, []).append(b"".join(_LEN(len(v)) + v for v in values))
                    continue
                values = getattr(parsed, name)
                if values:
                    fields.setdefault(name, []).append(np.array(values, dtype=datatypes.datatype_to_numpy(_NATIVE[name])))
        piece, piece_bytes = [], 0

    for tag_at, tag, start, end in walk_fields(view):
        number, kind = tag >> 3, tag & 7
        if start < 0:
            # A group: left to protobuf, in one piece with everything after it (after the elements
            # before it, so that bytes_contents keep their order).
            flush_piece()
            if wire:
                fields.setdefault(names[_BYTES_FIELD], []).append(b"".join(wire))
                wire, wire_bytes = [], 0
            piece = [view[tag_at:].tobytes()]
            break
        if kind == 2:
            size = end - start
            if number == _BYTES_FIELD:
                wire.append(_LEN(size))
                wire.append(view[start:end].tobytes())
                wire_bytes += 4 + size
                if wire_bytes >= PIECE_BYTES:
                    fields.setdefault(names[_BYTES_FIELD], []).append(b"".join(wire))
                    wire, wire_bytes = [], 0
                continue
            if size > PIECE_BYTES and (number in _FIXED_WIDTH or number in _VARINT_FIELDS):
                flush_piece()
                for part in _packed_parts(view[start:end], number):
                    piece = [encode_varint(tag), encode_varint(len(part)), part]
                    flush_piece()
                continue
        piece.append(view[tag_at:end])
        piece_bytes += end - tag_at
        if piece_bytes >= PIECE_BYTES:
            flush_piece()
    flush_piece()
    if wire:
        fields.setdefault(names[_BYTES_FIELD], []).append(b"".join(wire))
    return fields


def _packed_parts(data: memoryview, number: int):
    """A packed list's payload in parts of about PIECE_BYTES, cut between elements."""
    width = _FIXED_WIDTH.get(number)
    n = len(data)
    start = 0
    while start < n:
        end = min(n, start + PIECE_BYTES)
        if end < n:
            if width:
                end -= (end - start) % width
            else:
                # after the last byte of a varint (one below 0x80) at or before `end`
                while end > start and data[end - 1] >= 0x80:
                    end -= 1
                if end == start:
                    end = n  # no element ends in this part: protobuf gets the rest whole
        yield data[start:end].tobytes()
        start = end
