"""Moving tensors across the worker boundary: inline in the message, or via the arena.

Tensors at or below INLINE_LIMIT bytes ride inside the control message (one
copy into the message, cheaper than an allocation for tiny tensors); larger
ones are copied once into the sender's arena and read in place by the peer.
"""

from __future__ import annotations

import numpy as np

from kernel.backends.python import messages
from kernel.backends.python.arena import Arena, PeerArena
from kernel.core import datatypes

INLINE_LIMIT = 64 * 1024

# Numeric wire datatypes -> the numpy dtype a model sees (BF16: its raw bits as uint16), one dict
# look-up per input tensor instead of a call chain.
NUMERIC_DTYPES = {
    name: np.dtype(datatypes.datatype_to_numpy(name))
    for name in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64")
}
NUMERIC_DTYPES["BF16"] = np.dtype(np.uint16)


def pack(name: str, datatype: str, shape, raw, arena: Arena) -> messages.Tensor:
    """raw: bytes-like wire form. Returns the message form, writing to the arena if large."""
    nbytes = len(raw)
    if nbytes <= INLINE_LIMIT:
        return messages.Tensor(name, datatype, list(shape), bytes(raw))
    segment, offset = arena.write(raw, nbytes)
    return messages.Tensor(name, datatype, list(shape), None, segment, offset, nbytes)


def view(tensor: messages.Tensor, peer: PeerArena):
    """The tensor's wire bytes: the inline bytes, or a view into the peer's arena."""
    if tensor.data is not None:
        return tensor.data
    return peer.view(tensor.segment, tensor.offset, tensor.nbytes)


def arena_regions(tensors) -> list[tuple[int, int]]:
    return [(t.segment, t.offset) for t in tensors if t.data is None and t.ipc is None]


def arena_inputs(tensors, peer: PeerArena, inputs) -> list | None:
    """Where a request's arena inputs lie in this process: (start address, end address, segment,
    offset, the pb_utils.Tensor made of it) each, for ResponseSink.regions; None when none is in the
    arena (the common small case). inputs: the pb_utils tensors made of `tensors`, in order."""
    regions = None
    for t, made in zip(tensors, inputs):
        if t.data is None:
            seg = peer.segments.get(t.segment)
            if seg is not None:
                start = seg.addr + t.offset
                if regions is None:
                    regions = []
                regions.append((start, start + t.nbytes, t.segment, t.offset, made))
    return regions


def numeric_array(buffer, dtype: np.dtype, shape, writable: bool) -> np.ndarray:
    if writable and isinstance(buffer, bytes):
        buffer = bytearray(buffer)
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)
