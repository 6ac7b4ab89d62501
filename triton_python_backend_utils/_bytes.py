"""BYTES tensors in Triton's wire form (4-byte little-endian length, then the
bytes, per element): what models use to pack and unpack string tensors."""

from __future__ import annotations

import struct

import numpy as np

from ._errors import TritonModelException

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
