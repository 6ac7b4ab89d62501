"""Tensor datatypes: KServe v2 names, config.pbtxt TYPE_ names, numpy dtypes.

BYTES tensors travel in one serialized form everywhere (HTTP binary data, gRPC
raw contents, worker IPC): each element is a 4-byte little-endian length
followed by its bytes.
"""

from __future__ import annotations

import struct

import numpy as np

# KServe v2 datatype -> numpy dtype (BYTES maps to object arrays of bytes).
_NUMPY_BY_DATATYPE: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

# Element size in bytes; BYTES and BF16 have no numpy-native fixed element.
ELEMENT_SIZE: dict[str, int] = {
    name: dt.itemsize for name, dt in _NUMPY_BY_DATATYPE.items() if name != "BYTES"
}
ELEMENT_SIZE["BF16"] = 2

DATATYPES = frozenset(list(_NUMPY_BY_DATATYPE) + ["BF16"])

_DATATYPE_BY_NUMPY: dict[np.dtype, str] = {
    dt: name for name, dt in _NUMPY_BY_DATATYPE.items() if name != "BYTES"
}


def config_type_to_datatype(config_type: str) -> str:
    """'TYPE_FP32' -> 'FP32'; 'TYPE_STRING' -> 'BYTES'."""
    name = config_type[5:] if config_type.startswith("TYPE_") else config_type
    return "BYTES" if name == "STRING" else name


def datatype_to_config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype


def datatype_to_numpy(datatype: str) -> np.dtype | None:
    return _NUMPY_BY_DATATYPE.get(datatype)


def numpy_to_datatype(dtype: np.dtype) -> str | None:
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    return _DATATYPE_BY_NUMPY.get(dtype)


def element_count(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


_U32_PACK = struct.Struct("<I").pack


def serialize_bytes(array: np.ndarray) -> bytes:
    """Object/bytes/str array -> length-prefixed wire form (row-major order).

    Elements that are all bytes (or all str) are joined in one call with their packed lengths
    between them (~230 ns per bytes element here, against ~360 for the element-by-element loop
    that any other mix still takes)."""
    items = array.reshape(-1).tolist() if array.ndim else [array.item()]
    kinds = set(map(type, items))
    if kinds == {str}:
        items = [item.encode("utf-8") for item in items]
    elif kinds and kinds != {bytes}:  # (numpy scalars as the array holds them, as str() shows them)
        return _serialize_each(array.reshape(-1) if array.ndim else items)
    parts = [b""] * (2 * len(items))
    parts[0::2] = map(_U32_PACK, map(len, items))
    parts[1::2] = items
    return b"".join(parts)


def _serialize_each(items) -> bytes:
    parts = []
    pack = _U32_PACK
    for item in items:
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            item = str(item).encode("utf-8")
        parts.append(pack(len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def check_bytes(buffer, count: int) -> None:
    """That `buffer` holds exactly `count` length-prefixed elements; ValueError (deserialize_bytes's
    words) when not. Walks the prefixes without making the elements: ~150 ns per element here, where
    deserialize_bytes takes ~240 (and a list of 16 Mi objects for 64 MiB of empty elements).
    Still linear in the elements: a large tensor is checked beside the loop (kernel.core.admission)."""
    mv = memoryview(buffer).cast("B")
    end = len(mv)
    offset = found = 0
    unpack = _U32_FROM
    while offset < end:
        if offset + 4 > end:
            raise ValueError("truncated BYTES element length")
        offset += 4 + unpack(mv, offset)[0]
        found += 1
    if offset > end:
        raise ValueError("BYTES element runs past the end of its buffer")
    if found != count:
        raise ValueError(f"expected {count} BYTES elements, found {found}")


_U32_FROM = struct.Struct("<I").unpack_from


# Average element size up to which deserialize_bytes copies the buffer once and slices the copy.
_SLICE_COPY_MAX_AVERAGE = 1024


def deserialize_bytes(buffer, count: int | None = None) -> list[bytes]:
    """Length-prefixed wire form -> list of bytes. Raises ValueError on bad framing.

    When count is given the buffer must hold exactly that many elements. Small elements (the
    usual BYTES tensor: words, tokens, short texts) are slices of one bytes copy of the buffer:
    slicing bytes makes each element in one step, where bytes() of a memoryview slice takes two
    (~240 vs ~460 ns per element here; 16 Mi elements took a model's worker ~7 s). Large ones are
    copied straight out of the buffer, so that no element is copied twice.
    """
    mv = memoryview(buffer).cast("B")
    if count and mv.nbytes <= count * _SLICE_COPY_MAX_AVERAGE:
        items = _sliced(buffer if type(buffer) is bytes else mv.tobytes())
    else:
        items = _copied(mv)
    if count is not None and len(items) != count:
        raise ValueError(f"expected {count} BYTES elements, found {len(items)}")
    return items


def _sliced(data: bytes) -> list[bytes]:
    items: list[bytes] = []
    append = items.append
    unpack = _U32_FROM
    offset, end = 0, len(data)
    try:
        while offset < end:
            start = offset + 4
            offset = start + unpack(data, offset)[0]
            append(data[start:offset])
    except struct.error:  # fewer than 4 bytes left for a length
        raise ValueError("truncated BYTES element length") from None
    if offset > end:
        raise ValueError("BYTES element runs past the end of its buffer")
    return items


def _copied(mv: memoryview) -> list[bytes]:
    items: list[bytes] = []
    offset, end = 0, len(mv)
    unpack = _U32_FROM
    while offset < end:
        if offset + 4 > end:
            raise ValueError("truncated BYTES element length")
        (length,) = unpack(mv, offset)
        offset += 4
        if offset + length > end:
            raise ValueError("BYTES element runs past the end of its buffer")
        items.append(bytes(mv[offset : offset + length]))
        offset += length
    return items
