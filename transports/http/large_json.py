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

Decoding a request (`decode_request`), with no call that holds the lock for long (issue 31: one
msgspec call over the whole header took 50-170 ms for 24 MiB even when it built nothing, and
seconds when it built millions of objects): the objects and object members outside strings are
counted first and a header with more than MAX_JSON_OBJECTS is refused; json_scan finds the arrays
below the root's members, which are cut out, each replaced by a marker (_Envelope); the rest (the
envelope, a few kilobytes) is decoded at once; then each shape is counted (request_bounds.MAX_DIMS)
before it is decoded, each cut-out array nothing reads is checked as JSON, and each input's data is
read in pieces cut at commas outside strings, every piece checked (_flat) since msgspec never saw
the array whole, into its array (BYTES: into its wire form), with the checks, the order and the
words of codec.json_tensor.
"""

from __future__ import annotations

import asyncio
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Union

import msgspec
import numpy as np

from kernel.core import datatypes
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferResponse, InferTensor
from kernel.transports import request_bounds
from kernel.transports.http import codec, json_errors, json_scan

PIECE_ELEMENTS = 16384
PIECE_BYTES = 128 * 1024
# A request whose JSON header is larger than this is decoded here (below it: ~10 ms on the loop).
INLINE_REQUEST_BYTES = 256 * 1024
_COMMA, _BRACE, _COLON = 0x2C, 0x7B, 0x3A
# Data is read by dropping its brackets (and blanks, and the empty places an empty array leaves
# between commas); each byte is classed first, outside strings, to refuse an object and a bracket
# or comma where JSON has none ('[,' ',,' ',]' '1[' ']1' '][', or two values side by side), which
# the dropping would hide: msgspec does not read a cut-out array as a whole.
_BLANK, _OPEN, _CLOSE, _COMMA_KIND, _VALUE, _OBJECT = range(6)
_KIND = np.full(256, _VALUE, dtype=np.uint8)
_KIND[list(b" \t\r\n")] = _BLANK
_KIND[ord("[")], _KIND[ord("]")], _KIND[ord(",")] = _OPEN, _CLOSE, _COMMA_KIND
_KIND[list(b"{}:")] = _OBJECT
_WRONG_STEP = np.zeros(64, dtype=bool)  # (kind before) * 8 + (kind after) where JSON has no such step
for _before, _after in ((_OPEN, _COMMA_KIND), (_CLOSE, _OPEN), (_CLOSE, _VALUE), (_COMMA_KIND, _COMMA_KIND),
                        (_COMMA_KIND, _CLOSE), (_VALUE, _OPEN)):
    _WRONG_STEP[_before * 8 + _after] = True
_NO_START, _NO_END = (b",", b"]", b""), (b",", b"[", b"")
_BLANKED = bytes.maketrans(b"[]", b"  ")
_EMPTY_ARRAY = re.compile(rb"\[\s+\]")

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

# Objects and object members ('{' and ':') a large request's JSON may hold outside strings. Counted
# before anything is decoded (a plain count first; where strings may hold some, json_scan counts
# those outside them), so that the envelope's decode builds no more than this many objects: 600 000
# inputs took the front's interpreter lock for 1.0 s and 800 MB (issue 31). request_bounds' inputs and
# outputs with a few parameters each are far within it.
MAX_JSON_OBJECTS = 65536
_COUNT_BYTES = 1 << 20
# A cut-out array outside the tensors' data (a parameter's value, an unknown field) up to this size
# is checked as JSON in one call; a larger one in pieces like data, and refused if it holds objects.
_WHOLE_CHECK_BYTES = 1 << 20
# What the root object's member arrays are called when the decoder is to see them.
_KEPT = frozenset(("inputs", "outputs"))

# Each input's data and shape kept as raw JSON text (in the envelope: a marker or a scalar).
_decoders = codec.request_decoders(Union[msgspec.Raw, msgspec.UnsetType], msgspec.Raw)
_shape = msgspec.json.Decoder(list[int])
_raw = msgspec.json.Decoder(msgspec.Raw)
_NOT_JSON = "failed to parse the request JSON buffer: "
_OFFSET = re.compile(r"(\(byte |at )(\d+)")


class Malformed(KernelError):
    """JSON text that is not JSON, found after the envelope was decoded: the whole request's refusal."""

    def __init__(self, where: str):
        super().__init__(ErrorCode.INVALID_ARG, _NOT_JSON + where)

    @staticmethod
    def of(error: KernelError) -> KernelError:
        if error.message.startswith(_NOT_JSON) and not isinstance(error, Malformed):
            return Malformed(error.message[len(_NOT_JSON):])
        return error


class Decoded:
    """A request body decoded here, for codec.parse_infer_request(decoded=...): its header, its
    binary part, and per input its tensor, its refusal (raised in input order), or None (binary
    or shared-memory data, handled there). `error`: the body could not be decoded at all (raised
    there too, after the checks that come before the body's). The refusals carry no traceback:
    one would hold this thread's frames, and through them the body, until the next collection."""

    __slots__ = ("request", "binary", "tensors", "error")

    def __init__(self, request=None, binary=b"", tensors=None, error: Optional[KernelError] = None):
        self.request = request
        self.binary = binary
        self.tensors = tensors
        self.error = error


class _Envelope:
    """The header with its arrays cut out (json_scan.arrays_to_cut), each replaced by a marker:
    a two-number array no client sends (a random nonce and its index), which a Raw field keeps
    as it is and any other field refuses as an array, as it would the array it stands for."""

    def __init__(self, header, spans: list):
        self.header = header
        self.spans: dict = {}
        nonce = int.from_bytes(os.urandom(7), "little")
        parts = []
        done = 0
        for k, (start, end) in enumerate(spans):
            marker = b"[%d,%d]" % (nonce, k)
            parts += (header[done:start], marker)
            self.spans[marker] = (start, end + 1)
            done = end + 1
        parts.append(header[done:])
        self.text = b"".join(parts)
        self.used: set = set()

    def original(self, raw, read: bool = False):
        """The text `raw` stands for: its array's text (a memoryview of the header), or itself.
        read: the caller reads (and so checks) that text itself."""
        if len(raw) > 40:
            return raw
        marker = bytes(raw)
        span = self.spans.get(marker)
        if span is None:
            return raw
        if read:
            self.used.add(marker)
        return self.header[span[0]:span[1]]

    def in_header(self, error: KernelError) -> KernelError:
        """`error` (the envelope's) with its offsets in the header's bytes."""
        if not error.message.startswith(_NOT_JSON):
            return error
        return KernelError(error.code, _OFFSET.sub(lambda m: m.group(1) + str(self._header_offset(int(m.group(2)))),
                                                   error.message))

    def _header_offset(self, offset: int) -> int:
        moved = 0
        for marker, (start, end) in self.spans.items():
            if start + moved >= offset:
                break
            if start + moved + len(marker) > offset:
                return start  # within the marker: the array it stands for
            moved += len(marker) - (end - start)
        return offset - moved

    def unread(self):
        """The cut-out arrays nothing has read (parameters' values, unknown fields), in order."""
        for marker, (start, end) in self.spans.items():
            if marker not in self.used:
                yield self.header[start:end]


def decode_request(body, header_length: Optional[int]) -> Decoded:
    """The request decoded without a long call: its objects counted, its arrays cut out, the rest
    (the envelope: a few kilobytes) decoded at once, then each shape and each input's data read
    from its own text, the data in pieces."""
    try:
        header, binary = codec.split_body(body, header_length)
        _check_objects(header)
        try:
            envelope = _Envelope(header, json_scan.arrays_to_cut(header, _KEPT))
        except json_scan.TooDeep:
            raise Malformed("the JSON is nested too deeply") from None
        try:
            request = codec.decode_header(envelope.text, _decoders, envelope.original)
        except KernelError as exc:
            raise Malformed.of(envelope.in_header(exc)) from None
        refused = [_read_shape(inp, index, envelope) for index, inp in enumerate(request.inputs)]
        codec.check_counts(request)
        data = [envelope.original(inp.data, True) if inp.data is not msgspec.UNSET else msgspec.UNSET
                for inp in request.inputs]
        for text in envelope.unread():
            _check_json(text)
        tensors: list = []
        for index, (inp, refusal) in enumerate(zip(request.inputs, refused)):
            if refusal is None and codec.has_json_data(inp):
                inp.data = data[index]
                try:
                    refusal = _json_tensor(inp, index)
                except Malformed:
                    raise
                except KernelError as exc:
                    refusal = exc.with_traceback(None)
            tensors.append(refusal)
    except Malformed as exc:  # in tritonserver's words where a header is small enough to walk
        where = json_errors.describe(header)
        return Decoded(error=exc.with_traceback(None) if where is None else Malformed(where))
    except KernelError as exc:
        return Decoded(error=exc.with_traceback(None))
    return Decoded(request, binary, tensors)


def has_empty_array(text: bytes) -> bool:
    """Whether JSON text holds an empty array ('[]', '[ ]'): a hole the piecewise reading cannot see."""
    return b"[]" in text or _EMPTY_ARRAY.search(text) is not None


def _check_objects(header) -> None:
    a = np.frombuffer(header, dtype=np.uint8)
    objects = members = 0
    for start in range(0, a.size, _COUNT_BYTES):
        w = a[start:start + _COUNT_BYTES]
        objects += int(np.count_nonzero(w == _BRACE))
        members += int(np.count_nonzero(w == _COLON))
    if objects <= MAX_JSON_OBJECTS and members <= MAX_JSON_OBJECTS:
        return
    objects, members = json_scan.count_outside(header, b"{:")
    if objects > MAX_JSON_OBJECTS or members > MAX_JSON_OBJECTS:
        raise KernelError(ErrorCode.INVALID_ARG, (
            f"Unable to parse inference request: its JSON holds more than {MAX_JSON_OBJECTS} objects or object "
            f"members outside the tensors' data (a request may have at most {request_bounds.MAX_TENSORS} inputs and "
            f"{request_bounds.MAX_TENSORS} outputs, each with a few parameters)"))


def _read_shape(inp, index: int, envelope: _Envelope) -> Optional[KernelError]:
    """Replace the input's raw shape with the list it holds; its refusal if it holds more than
    MAX_DIMS. KernelError (the whole request's, as codec words it) when it is not a list of integers."""
    text = envelope.original(inp.shape, True)
    if len(text) > _COUNT_BYTES // 256:
        a = np.frombuffer(text, dtype=np.uint8)
        dims = 1 + sum(int(np.count_nonzero(a[i:i + _COUNT_BYTES] == _COMMA)) for i in range(0, a.size, _COUNT_BYTES))
        if dims > request_bounds.MAX_DIMS:
            inp.shape = []
            return request_bounds.too_many_dims(inp.name, dims)
    try:
        inp.shape = _shape.decode(text)
    except msgspec.ValidationError as exc:
        where = str(exc).replace("`$", f"`$.inputs[{index}].shape", 1)
        raise KernelError(ErrorCode.INVALID_ARG, f"Unable to parse inference request: {where}") from None
    except msgspec.DecodeError as exc:
        raise Malformed(f"{exc} (in the shape of input '{inp.name}')") from None
    return None


def _check_json(text) -> None:
    """Malformed unless `text` (an array nothing reads) is JSON; a large one is read in pieces."""
    if len(text) <= _WHOLE_CHECK_BYTES:
        try:
            _raw.decode(text)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise Malformed(str(exc)) from None
        return
    for values in _pieces(memoryview(text), -1):
        if values is None:
            raise KernelError(ErrorCode.INVALID_ARG, (
                f"Unable to parse inference request: an array of {len(text)} bytes outside the tensors' data "
                f"holds objects (one outside the data may take at most {_WHOLE_CHECK_BYTES} bytes if it does)"))


def _json_tensor(inp, index: int) -> InferTensor:
    datatype = inp.datatype
    if (inp.data is msgspec.UNSET or datatype not in datatypes.DATATYPES or datatype == "BF16"
            or any(d < 0 for d in inp.shape)):
        # Refused before the data is looked at: codec's checks, on a stand-in for the data.
        stand_in = msgspec.UNSET if inp.data is msgspec.UNSET else []
        return codec.json_tensor(msgspec.structs.replace(inp, data=stand_in))
    count = datatypes.element_count(inp.shape)
    strings = datatype == "BYTES"
    if not strings:
        allowed, message = codec.JSON_KINDS[datatype]
        unsigned = datatype in codec.UNSIGNED
        dtype = datatypes.datatype_to_numpy(datatype)
    arrays = []
    total = 0
    problem: Optional[KernelError] = None
    for values in _pieces(memoryview(inp.data), index):
        if values is None:
            raise codec.object_error(inp)
        total += len(values)
        if problem is not None or not values:
            continue
        if strings:
            problem = codec.not_strings(inp, values)
            if problem is None:
                arrays.append(_serialized(values))
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
    if strings:  # in wire form (4-byte lengths): no Python object per element outlives the piece
        return InferTensor(inp.name, "BYTES", inp.shape, raw=memoryview(_joined(arrays, np.uint8)))
    return codec.shaped(inp, arrays[0] if len(arrays) == 1 else _joined(arrays, dtype))


def _joined(arrays: list, dtype) -> np.ndarray:
    """np.concatenate, one copy per piece (a call each: a large one would hold the lock long)."""
    arrays = [np.frombuffer(a, dtype=np.uint8) if isinstance(a, bytes) else a for a in arrays]
    out = np.empty(sum(a.size for a in arrays), dtype=dtype)
    done = 0
    for a in arrays:
        out[done:done + a.size] = a
        done += a.size
    return out


def _serialized(strings: list) -> bytes:
    """Strings in BYTES wire form: each one's UTF-8 after its length (4 bytes, little-endian)."""
    joined = "".join(strings).encode("utf-8")
    if len(joined) == sum(map(len, strings)):  # ASCII: as many bytes as characters
        lengths = np.fromiter(map(len, strings), dtype=np.int64, count=len(strings))
    else:
        encoded = [s.encode("utf-8") for s in strings]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    payload = np.frombuffer(joined, dtype=np.uint8)
    out = np.empty(4 * lengths.size + payload.size, dtype=np.uint8)
    heads = 4 * np.arange(lengths.size) + np.cumsum(lengths) - lengths  # where each length goes
    out[heads[:, None] + np.arange(4)] = lengths.astype("<u4").view(np.uint8).reshape(-1, 4)
    out[np.arange(payload.size) + 4 * (np.repeat(np.arange(lengths.size), lengths) + 1)] = payload
    return out.tobytes()


def _pieces(text: memoryview, index: int):
    """An input's data, flat, list by list: the text inside its brackets cut at commas outside
    strings into pieces of about PIECE_BYTES, each checked and read in one short decode with its
    array brackets dropped (Triton reads nested arrays in row-major order). None for a piece that
    holds an object. Malformed for text that is not JSON (msgspec has not read a cut-out array)."""
    size = len(text)
    if size == 0 or text[0] != ord("["):  # one value, not an array (checked by the envelope's decode)
        yield None if size and text[0] == _BRACE else [_decode(bytes(text), index)]
        return
    if text[size - 1] != ord("]"):
        raise Malformed(f"unterminated array in the data of input {index}")
    inner = text[1:size - 1]
    size -= 2
    strings = json_scan.Strings()
    parts: list = []
    first = True
    for pos in range(0, size, PIECE_BYTES):
        chunk = inner[pos:pos + PIECE_BYTES].tobytes()
        if pos + PIECE_BYTES >= size:
            parts.append(chunk)
            break
        if strings.inside or b'"' in chunk:
            cut = json_scan.last_outside(np.frombuffer(chunk, dtype=np.uint8), _COMMA, strings)
        else:
            cut = chunk.rfind(b",")
        if cut < 0:
            parts.append(chunk)  # within one long string: no cut here
            continue
        parts.append(chunk[:cut])
        yield _flat(b"".join(parts), index, first, False)
        first = False
        parts = [chunk[cut + 1:]]
    yield _flat(b"".join(parts), index, first, True)


def _flat(piece: bytes, index: int, first: bool, last: bool) -> Optional[list]:
    """One piece's values; `first`, `last`: whether no cut comma comes before it, after it.

    Numbers, flat or nested, and strings without brackets are msgspec's to check, brackets turned
    to blanks (which keep two values apart, so that a bracket where JSON has none leaves values side
    by side or a comma out of place), but for the cut commas around the piece, checked here. The
    rest (empty arrays, strings with brackets in them) is classed byte by byte, strings' bytes as
    a value's, checked step by step, and read with its brackets, blanks and empty places dropped."""
    quoted = b'"' in piece
    nested = b"[" in piece or b"]" in piece
    objects = b"{" in piece or b"}" in piece or b":" in piece
    if objects and not quoted:
        return None
    if not (quoted and (nested or objects)) and not (nested and (b"[]" in piece or _EMPTY_ARRAY.search(piece))):
        ends = piece.strip(b" \t\r\n")
        if (not first and ends[:1] in _NO_START) or (not last and ends[-1:] in _NO_END):
            raise Malformed(f"misplaced bracket or ',' in the data of input {index}")
        return _decode(b"[" + (piece.translate(_BLANKED) if nested else piece) + b"]", index)
    a = np.frombuffer(piece, dtype=np.uint8)
    kind = _KIND[a]
    if quoted:
        kind[~json_scan.outside_mask(a)] = _VALUE
    if np.any(kind == _OBJECT):
        return None
    at = np.flatnonzero(kind != _BLANK)
    kinds = kind[at]
    # with what comes before and after: the array's own bracket, or the comma it was cut at
    around = np.concatenate(([_OPEN if first else _COMMA_KIND], kinds, [_CLOSE if last else _COMMA_KIND]))
    steps = around[:-1] * 8 + around[1:]
    if np.any(_WRONG_STEP[steps]) or np.any((steps[1:-1] == _VALUE * 9) & (np.diff(at) > 1)):
        raise Malformed(f"misplaced bracket or ',' in the data of input {index}")
    keep = (kinds == _VALUE) | (kinds == _COMMA_KIND)
    at, commas = at[keep], kinds[keep] == _COMMA_KIND
    empty = commas & np.concatenate(([True], commas[:-1]))  # first, or right after another comma
    if commas.size and commas[-1]:
        empty[-1] = True
    return _decode(b"[" + a[at[~empty]].tobytes() + b"]", index)


def _decode(text: bytes, index: int):
    try:
        return _values.decode(text)
    except msgspec.ValidationError as exc:  # a number out of range
        raise KernelError(ErrorCode.INVALID_ARG,
                          f"Unable to parse inference request: {str(exc).split(' - at ')[0]} - at "
                          f"`$.inputs[{index}].data`") from None
    except msgspec.DecodeError as exc:
        raise Malformed(f"{str(exc).split(' (byte')[0]} (in the data of input {index})") from None
