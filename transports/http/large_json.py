"""JSON too large for one go on the event loop: decoded and encoded in pieces, on a thread beside it.

Why: a 1 GiB output asked for as JSON froze every client of the front for 52 s (and took it to
12.9 GB), a 128 MiB one for 2.6 s, and a 64 MiB JSON request body took ~3 s to decode on the
loop (issue 23). msgspec and numpy hold the GIL for the whole of each call, so moving the work
to a thread is not enough by itself: it is cut into pieces of about PIECE_ELEMENTS elements
(PIECE_BYTES of text), each one short call, and between two pieces the loop takes the GIL back
(within the interpreter's switch interval, 5 ms). One thread does this work for the front
(`run`): more would not go faster under one GIL, and one at a time bounds the memory it uses.

Encoding an answer (`encode_answer`): the KServe v2 JSON is written into one bytearray, each
output's data piece by piece with msgspec's encode_into, and the work stops as soon as the text
passes the limit (--http-max-json-output-size): the answer is then refused naming the limit
instead of growing without bound. The text is byte for byte codec.encode_infer_response's.

Decoding a request (`decode_request`): the JSON is decoded with each input's `data` kept as raw
text (msgspec.Raw: one pass that checks the syntax and builds nothing, ~0.2 s for 64 MiB on
this box: the one long call that is left); then each numeric input's text is read piece by piece
into its array, with the checks, the order and the words of codec.json_tensor. Data that holds
strings (BYTES, or text where numbers belong) or empty nested arrays is decoded whole, as codec
does it.
"""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Union

import msgspec
import numpy as np

from kernel.core import datatypes
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferResponse, InferTensor
from kernel.transports.http import codec

PIECE_ELEMENTS = 16384
PIECE_BYTES = 128 * 1024
# A request whose JSON header is larger than this is decoded here (below it: ~10 ms on the loop).
INLINE_REQUEST_BYTES = 256 * 1024
# Nested arrays of numbers are read by dropping the brackets; an empty one would leave a hole.
_EMPTY_ARRAY = re.compile(rb"\[\s*\]")
_COMMA = 0x2C

_executor: Optional[ThreadPoolExecutor] = None
_encoder = msgspec.json.Encoder()
_values = msgspec.json.Decoder()


def run(fn, *args) -> asyncio.Future:
    """fn(*args) on the JSON thread; a future of the running loop."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(1, thread_name_prefix="kernel-json")
    return asyncio.get_running_loop().run_in_executor(_executor, fn, *args)


def too_large_for_loop(body, header_length: Optional[int]) -> bool:
    """Whether an infer request body's JSON is large enough to be decoded here."""
    if header_length is None:
        return len(body) > INLINE_REQUEST_BYTES
    return header_length > INLINE_REQUEST_BYTES and header_length <= len(body)


# ---- answers -------------------------------------------------------------------------


def encode_answer(response: InferResponse, binary_default: bool, binary_choice: dict, limit: int):
    """codec.encode_infer_response's (body or body parts, JSON length) for an answer with large
    JSON data, built in pieces; KernelError (400) once the JSON passes `limit` bytes."""
    buf = bytearray()
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = []
    _encoder.encode_into(doc, buf)
    del buf[-2:]  # '..."outputs":['
    blobs = []
    for i, t in enumerate(response.outputs):
        if i:
            buf.append(_COMMA)
        use_binary = binary_choice.get(t.name, binary_default)
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if use_binary is codec.IN_SHARED_MEMORY:
            pass
        elif use_binary:
            raw = t.raw
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = []
            _encoder.encode_into(entry, buf, -1)
            del buf[-1]  # '..."data":[]'
            _data_into(buf, t, response.model_name, limit)
            buf.append(ord("}"))
            continue
        _encoder.encode_into(entry, buf, -1)
        _check(buf, response.model_name, limit)
    buf += b"]}"
    _check(buf, response.model_name, limit)
    if not blobs:
        return buf, None
    return [buf, *blobs], len(buf)


def _data_into(buf: bytearray, t: InferTensor, model: str, limit: int) -> None:
    """Write t's data over the '[]' that `buf` ends with, piece by piece."""
    flat = t.as_numpy().reshape(-1)
    count = flat.size
    strings = t.datatype == "BYTES"
    # Each element takes at least one character and a comma (a string two and a comma).
    if len(buf) + (3 if strings else 2) * count - 1 > limit:
        raise codec.json_too_large(model, limit)
    values_into(buf, flat, lambda: _check(buf, model, limit), strings)


def values_into(buf: bytearray, flat: np.ndarray, check: Callable[[], None], strings: bool = False) -> None:
    """Write a flat array's values as JSON over the '[]' that `buf` ends with, PIECE_ELEMENTS at a
    time (each piece one short call); `check()` after each piece, which raises to stop."""
    for start in range(0, flat.size, PIECE_ELEMENTS):
        piece = flat[start:start + PIECE_ELEMENTS]
        values = codec.json_strings(piece) if strings else piece.tolist()
        at = len(buf) - (2 if start == 0 else 1)  # over '[]' first, then over the closing ']'
        _encoder.encode_into(values, buf, at)
        if start:
            buf[at] = _COMMA
        check()


def _check(buf: bytearray, model: str, limit: int) -> None:
    if len(buf) > limit:
        raise codec.json_too_large(model, limit)


# ---- requests ------------------------------------------------------------------------


class _RawInput(msgspec.Struct):
    name: str
    shape: list[int]
    datatype: str
    parameters: Optional[dict[str, Any]] = None
    data: Union[msgspec.Raw, msgspec.UnsetType] = msgspec.UNSET


class _RawRequest(msgspec.Struct):
    inputs: list[_RawInput]
    id: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    outputs: Optional[list[codec.OutputJSON]] = None


_raw_request = msgspec.json.Decoder(_RawRequest)


class Decoded:
    """A request body decoded here, for codec.parse_infer_request(decoded=...): its header, its
    binary part, and per input its tensor, its refusal (raised in input order), or None (binary
    or shared-memory data, handled there). `error`: the body could not be decoded at all (raised
    there too, after the checks that come before the body's)."""

    __slots__ = ("request", "binary", "tensors", "error")

    def __init__(self, request=None, binary=b"", tensors=None, error: Optional[KernelError] = None):
        self.request = request
        self.binary = binary
        self.tensors = tensors
        self.error = error


def decode_request(body, header_length: Optional[int]) -> Decoded:
    try:
        header, binary = codec.split_body(body, header_length)
        request = codec.decode_header(header, _raw_request)
    except KernelError as exc:
        return Decoded(error=exc)
    tensors: list = []
    for inp in request.inputs:
        if not codec.has_json_data(inp):
            tensors.append(None)
            continue
        try:
            tensors.append(_json_tensor(inp))
        except KernelError as exc:
            tensors.append(exc)
    return Decoded(request, binary, tensors)


def has_empty_array(text: bytes) -> bool:
    """Whether JSON text holds an empty array ('[]', '[ ]'): a hole the piecewise reading cannot see."""
    return _EMPTY_ARRAY.search(text) is not None


def _json_tensor(inp: _RawInput) -> InferTensor:
    datatype = inp.datatype
    if (inp.data is msgspec.UNSET or datatype not in datatypes.DATATYPES or datatype == "BF16"
            or any(d < 0 for d in inp.shape)):
        # Refused before the data is looked at: codec's checks, on a stand-in for the data.
        return codec.json_tensor(codec.InputJSON(inp.name, inp.shape, datatype, inp.parameters,
                                                 msgspec.UNSET if inp.data is msgspec.UNSET else []))
    if datatype != "BYTES":
        tensor = _numbers(inp, memoryview(inp.data))
        if tensor is not None:
            return tensor
    return codec.json_tensor(codec.InputJSON(inp.name, inp.shape, datatype, inp.parameters, _whole(inp.data)))


def _whole(raw) -> Any:
    try:
        return _values.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # checked once already: only nesting is left to fail
        raise KernelError(ErrorCode.INVALID_ARG,
                          "failed to parse the request JSON buffer: the JSON is nested too deeply") from None


def _numbers(inp: _RawInput, text: memoryview) -> Optional[InferTensor]:
    """The input from its data's text, read piece by piece; None: decode it whole instead."""
    count = datatypes.element_count(inp.shape)
    allowed, message = codec.JSON_KINDS[inp.datatype]
    unsigned = inp.datatype in codec.UNSIGNED
    dtype = datatypes.datatype_to_numpy(inp.datatype)
    arrays = []
    total = 0
    problem: Optional[KernelError] = None
    size = len(text)
    carry = b""
    pos = 0
    while pos < size:
        block = carry + text[pos:pos + PIECE_BYTES].tobytes()
        pos += PIECE_BYTES
        if pos < size:
            cut = block.rfind(b",")
            if cut < 0:
                if len(block) > 4 * PIECE_BYTES:
                    return None  # no comma for this long: not a list of numbers
                carry = block
                continue
            piece, carry = block[:cut], block[cut + 1:]
        else:
            piece, carry = block, b""
        if b'"' in piece or _EMPTY_ARRAY.search(piece):
            return None
        try:
            values = _values.decode(b"[" + piece.translate(None, b"[]") + b"]")
        except msgspec.DecodeError:
            return None
        total += len(values)
        if problem is not None or not values:
            continue
        if not allowed.issuperset(map(type, values)) or (unsigned and min(values) < 0):
            problem = KernelError(ErrorCode.INVALID_ARG, message)
            continue
        try:
            arrays.append(np.array(values, dtype=dtype))
        except (ValueError, TypeError, OverflowError) as exc:
            problem = codec.conversion_error(inp, exc)
    if total != count:
        raise codec.count_error(inp, total, count)
    if problem is not None:
        raise problem
    flat = np.concatenate(arrays) if len(arrays) > 1 else (arrays[0] if arrays else np.empty(0, dtype))
    return codec.shaped(inp, flat)
