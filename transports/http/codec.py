"""KServe v2 HTTP inference bodies <-> core requests and responses.

The request body is a JSON header optionally followed by binary tensor data
(binary tensor data extension): `Inference-Header-Content-Length` says where
the JSON ends, and each binary input's `binary_data_size` parameter says how
many of the following bytes are its data, in input order.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import msgspec
import numpy as np

from kernel.core import datatypes
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor, RequestedOutput
from kernel.core.shared_memory import OutputWindow, RequestWindows, SharedMemoryManager
from kernel.transports import request_bounds
from kernel.transports.request_bounds import MAX_DIMS, MAX_TENSORS
from kernel.transports.http import json_errors, parameters

# What a parameter may hold, as tritonserver reads them: int, bool, string, and JSON numbers (as
# doubles); null is let through to the checks that refuse it with tritonserver's words. Typed so
# (large_json's decoders), msgspec stops at the first array or object instead of building it
# (issue 31: 24 MiB of `[],...` in one parameter took 1.9 s of the front's interpreter lock); see
# decode_header for what then. A header small enough to decode on the loop keeps them untyped:
# its size bounds the work, and the checks after the decode are the same.
Scalar = Union[None, bool, int, float, str]
Parameters = dict[str, Scalar]


def request_struct(data: Any, shape: Any, params: Any) -> type:
    """The KServe v2 infer request JSON as msgspec Structs, with these types for each input's
    `data` and `shape` and for every `parameters` (request, input and output)."""
    given = Optional[params]
    inp = msgspec.defstruct("InputJSON", [("name", str), ("shape", shape), ("datatype", str),
                                          ("parameters", given, None), ("data", data, msgspec.UNSET)])
    out = msgspec.defstruct("OutputJSON", [("name", str), ("parameters", given, None)])
    return msgspec.defstruct("RequestJSON", [("inputs", list[inp]), ("id", Optional[str], None),
                                             ("parameters", given, None), ("outputs", Optional[list[out]], None)])


def request_decoders(data: Any, shape: Any) -> tuple[msgspec.json.Decoder, msgspec.json.Decoder]:
    """For decode_header: the request's decoder, and its twin that keeps each parameter's JSON as it is."""
    return (msgspec.json.Decoder(request_struct(data, shape, Parameters)),
            msgspec.json.Decoder(request_struct(data, shape, dict[str, msgspec.Raw])))


_decoders = (msgspec.json.Decoder(request_struct(Any, list[int], dict[str, Any])), None)
_scalar = msgspec.json.Decoder(Scalar)
_any = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
# A parameter that is not a scalar is kept as itself up to this size (for the messages that show
# it), as an empty one of its kind beyond.
_SHOWN_PARAMETER_BYTES = 64


def _bad(message: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, message)


def decode_header(header, decoders=_decoders, original=None):
    """The request's JSON header (as request_struct), refused with tritonserver's words.

    With typed parameters (request_decoders), a parameter that is an array or an object stops the
    first decoder at once; the header is then
    decoded again with every parameter's JSON kept as it is (msgspec.Raw: nothing built), each
    scalar decoded and the others replaced by a stand-in (_parameter), so that the checks after
    this refuse a request parameter or a reserved tensor parameter with tritonserver's words and
    ignore any other tensor parameter, as tritonserver does. original(raw): the JSON text a raw
    value stands for (large_json cuts arrays out of the header before it is decoded)."""
    strict, lenient = decoders
    try:
        try:
            return strict.decode(header)
        except msgspec.ValidationError as exc:
            request = None if lenient is None else _with_raw_parameters(header, lenient, original)
            if request is None:
                raise _bad(f"Unable to parse inference request: {exc}") from None
            return request
    except msgspec.DecodeError as exc:  # not JSON (seen by either decoder)
        # tritonserver's words and offset for a body that is not JSON (issue 13); 400, not its 500:
        # the mistake is the client's (issue 14).
        where = json_errors.describe(header)
        if where is None:
            raise _bad(f"failed to parse the request JSON buffer: {exc}") from None
        raise _bad(f"failed to parse the request JSON buffer: {where}") from None
    except UnicodeDecodeError as exc:
        raise _bad(f"failed to parse the request JSON buffer: invalid UTF-8: {exc}") from None
    except RecursionError:
        raise _bad("failed to parse the request JSON buffer: the JSON is nested too deeply") from None


def _with_raw_parameters(header, decoder, original):
    try:
        request = decoder.decode(header)
    except msgspec.ValidationError:
        return None  # wrong for another reason too: the first decoder's words
    for holder in (request, *request.inputs, *(request.outputs or ())):
        if holder.parameters:
            holder.parameters = {key: _parameter(raw, original) for key, raw in holder.parameters.items()}
    return request


def _parameter(raw: msgspec.Raw, original=None):
    try:
        return _scalar.decode(raw)
    except msgspec.ValidationError:
        text = raw if original is None else original(raw)
        if len(text) <= _SHOWN_PARAMETER_BYTES:
            try:
                return _any.decode(text)
            except msgspec.DecodeError:
                pass  # (a cut-out array not read yet: large_json refuses it as malformed)
        return [] if memoryview(text)[0] == ord("[") else {}


def check_counts(req) -> None:
    """Refuse a request that names more inputs or outputs than request_bounds allows."""
    request_bounds.check_tensors(len(req.inputs), len(req.outputs or ()))


# What each datatype's JSON `data` may hold, and Triton's message when it holds something else.
# A bool is not a number here and a float is not an integer: Triton refuses both rather than coerce.
_NUMBER, _INTEGER, _BOOLEAN = frozenset((int, float)), frozenset((int,)), frozenset((bool,))
JSON_KINDS = {
    "BOOL": (_BOOLEAN, "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    **{t: (_NUMBER, "Unable to parse 'data': attempt to access JSON non-number as double")
       for t in ("FP16", "FP32", "FP64")},
    **{t: (_INTEGER, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer")
       for t in ("INT8", "INT16", "INT32", "INT64")},
    **{t: (_INTEGER, "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer")
       for t in ("UINT8", "UINT16", "UINT32", "UINT64")},
}
UNSIGNED = frozenset(("UINT8", "UINT16", "UINT32", "UINT64"))


def json_tensor(inp) -> InferTensor:
    """An input (request_struct's) given as JSON `data`, checked as tritonserver checks it (an object
    among the data is refused as the wrong type, as there, even where the count is wrong too)."""
    datatype = inp.datatype
    if datatype not in datatypes.DATATYPES:
        raise _bad(f"invalid datatype for input {inp.name}")  # tritonserver's words
    if any(d < 0 for d in inp.shape):
        raise _bad(f"invalid shape {inp.shape} for input '{inp.name}': dimensions must be >= 0")
    data = inp.data
    if data is msgspec.UNSET:
        raise _bad(f"must specify the 'data' field for input '{inp.name}'")
    if datatype == "BF16":
        raise _bad(f"BF16 input '{inp.name}' must be sent as binary data")
    count = datatypes.element_count(inp.shape)
    flat = flatten(data)
    if len(flat) != count:
        raise object_error(inp) if dict in set(map(type, flat)) else count_error(inp, len(flat), count)
    if datatype == "BYTES":
        problem = not_strings(inp, flat)
        if problem is not None:
            raise problem
        arr = np.empty(count, dtype=np.object_)
        arr[:] = [item.encode("utf-8") for item in flat]
        return shaped(inp, arr)
    allowed, message = JSON_KINDS[datatype]
    if not allowed.issuperset(map(type, flat)) or (datatype in UNSIGNED and flat and min(flat) < 0):
        raise _bad(message)
    try:
        arr = np.array(flat, dtype=datatypes.datatype_to_numpy(datatype))
    except (ValueError, TypeError, OverflowError) as exc:
        raise conversion_error(inp, exc) from None
    return shaped(inp, arr)


def object_error(inp) -> KernelError:
    """An object among an input's JSON data."""
    if inp.datatype == "BYTES":
        return _bad(f"expected string data for BYTES input '{inp.name}', got dict")
    return _bad(JSON_KINDS[inp.datatype][1])


def not_strings(inp, items: list) -> Optional[KernelError]:
    """The refusal of a BYTES input's data for its first element that is not a string, if any."""
    if set(map(type, items)) <= {str}:
        return None
    wrong = next(item for item in items if not isinstance(item, str))
    return _bad(f"expected string data for BYTES input '{inp.name}', got {type(wrong).__name__}")


def count_error(inp, got: int, count: int) -> KernelError:
    kind = "string elements" if inp.datatype == "BYTES" else "elements"
    return _bad(f"unexpected number of {kind} {got} for inference input '{inp.name}', expecting {count}")


def conversion_error(inp, exc: Exception) -> KernelError:
    return _bad(f"unable to parse 'data' of input '{inp.name}' as {inp.datatype}: {exc}")


def shaped(inp, flat: np.ndarray) -> InferTensor:
    """The tensor in its shape; a shape numpy cannot hold (over 64 dimensions) stays in wire form
    so that the model's own shape check refuses it with Triton's message."""
    try:
        return InferTensor(inp.name, inp.datatype, inp.shape, array=flat.reshape(inp.shape))
    except ValueError:
        if inp.datatype == "BYTES":
            return InferTensor(inp.name, "BYTES", inp.shape, raw=datatypes.serialize_bytes(flat))
        return InferTensor(inp.name, inp.datatype, inp.shape, raw=memoryview(flat).cast("B"))


def flatten(data) -> list:
    """`data` as one flat list (Triton reads nested JSON arrays in row-major order); no recursion."""
    if not isinstance(data, list):
        return [data]
    if list not in set(map(type, data)):
        return data
    out: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def header_length(value: bytes) -> int:
    """An Inference-Header-Content-Length value: decimal digits only.

    Why strict: int() would also take "+5", " 5 " and "1_0", so two parsers of
    the same request (a proxy and us) could split header and binary data differently.
    """
    if not value.isdigit() or len(value) > 19:
        raise _bad(f"Unable to parse inference header size, got: {value.decode('latin-1')[:40]}")
    return int(value)


def split_body(body, header_length: Optional[int]):
    """(JSON header, binary data) of an infer request body."""
    if header_length is None:
        return body, b""
    if header_length < 0 or header_length > len(body):
        raise _bad(f"inference header size should be in range (0, {len(body)}), got: {header_length}")
    mv = memoryview(body)
    return mv[:header_length], mv[header_length:]


def _taken(holder, key):
    """holder[key] (or its attribute), left None there: raised from a frame that holds `holder`, an
    error still held there would make a cycle (error, traceback, frame) that keeps the body alive."""
    if isinstance(holder, list):
        value, holder[key] = holder[key], None
    else:
        value = getattr(holder, key)
        setattr(holder, key, None)
    return value


def has_json_data(inp) -> bool:
    """Whether an input's data is its JSON `data` (not binary data, not a shared-memory region)."""
    params = inp.parameters
    return not params or ("shared_memory_region" not in params and params.get("binary_data_size") is None)


def parse_infer_request(
    body: bytes, header_length: Optional[int], model_name: str, model_version: str,
    shm: Optional[SharedMemoryManager] = None, decoded=None,
) -> tuple[InferRequest, bool, dict[str, object]]:
    """Returns (request, binary outputs by default, per-output choice).

    The per-output choice is True/False for binary or JSON data, or
    IN_SHARED_MEMORY for an output written into a client region (`shm` holds
    the registered regions; without it shared-memory parameters are refused).
    decoded: the body decoded beside the event loop already (large_json.decode_request): its
    header, and the tensors (or the refusals) of its JSON-data inputs.
    """
    ready = None
    if decoded is None:
        header, binary = split_body(body, header_length)
        req = decode_header(header)
    else:
        if decoded.error is not None:
            raise _taken(decoded, "error")
        req, binary, ready = decoded.request, decoded.binary, decoded.tensors
    if len(req.inputs) > MAX_TENSORS or (req.outputs is not None and len(req.outputs) > MAX_TENSORS):
        check_counts(req)
    tensors = []
    offset = 0
    windows: Optional[RequestWindows] = None  # client shared-memory windows, if any tensor uses one
    for index, inp in enumerate(req.inputs):
        if ready is not None and isinstance(ready[index], KernelError):
            raise _taken(ready, index)
        if len(inp.shape) > MAX_DIMS:
            raise request_bounds.too_many_dims(inp.name, len(inp.shape))
        size = None
        if inp.parameters:
            size = inp.parameters.get("binary_data_size")
            if "shared_memory_region" in inp.parameters:
                windows = windows or RequestWindows()
                tensors.append(_shm_input(inp, size, shm, windows))
                continue
        if size is None:
            if ready is None:
                tensors.append(json_tensor(inp))
                continue
            tensors.append(ready[index])
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _bad(f"invalid binary_data_size for input '{inp.name}'")
        if inp.data is not msgspec.UNSET:
            raise _bad(f"input '{inp.name}' has both 'data' and binary data")
        if inp.datatype not in datatypes.DATATYPES:
            raise _bad(f"invalid datatype for input {inp.name}")
        if offset + size > len(binary):
            raise _bad(
                f"unexpected size for input '{inp.name}', expecting {size} bytes of binary data "
                f"but only {len(binary) - offset} bytes remain in the request body"
            )
        tensors.append(InferTensor(inp.name, inp.datatype, inp.shape, raw=binary[offset : offset + size]))
        offset += size
    if offset != len(binary):  # binary data that no input claims (tritonserver's words)
        raise _bad(f"unexpected additional input data for model '{model_name}'")
    outputs = None
    binary_choice: dict[str, object] = {}
    if req.outputs is not None:
        outputs = []
        for o in req.outputs:
            oparams = o.parameters or {}
            if "shared_memory_region" in oparams:
                windows = windows or RequestWindows()
                windows.outputs[o.name] = _shm_output(o.name, oparams, shm, windows)
                binary_choice[o.name] = IN_SHARED_MEMORY
            elif "binary_data" in oparams:
                binary_choice[o.name] = parameters.boolean("binary_data", oparams["binary_data"])
            outputs.append(RequestedOutput(o.name, oparams))
    request = InferRequest(model_name, model_version, req.id or "", tensors, outputs)
    request.shm = windows
    binary_default = parameters.apply(request, req.parameters)
    return request, binary_default, binary_choice


def raw_infer_request(body: bytes, model, model_name: str, model_version: str) -> InferRequest:
    """A request whose body is raw tensor data (Inference-Header-Content-Length: 0), as tritonserver
    takes it: the data of the model's only input, its datatype from the config and its shape
    deduced from the config's dims (batch 1 for a batching model; one -1 dimension from the size)."""
    inputs = model.config.input
    if len(inputs) != 1:
        raise _bad(f"[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but "
                   f"got {len(inputs)} inputs in '{model_name}' model configuration")
    spec = model.inputs[inputs[0].name]
    shape = [1] if model.max_batch_size != 0 else []
    dynamic = -1
    count = 1
    for d in spec.dims:
        if d == -1:
            if dynamic != -1:
                raise _bad(f"[request id: <id_unknown>] The shape of the raw input '{spec.name}' can not be "
                           "deduced because there are more than one variable-sized dimension")
            dynamic = len(shape)
        else:
            count *= d
        shape.append(d)
    if spec.datatype == "BYTES":
        if dynamic != -1 or count != 1:
            raise _bad(f"[request id: <id_unknown>] For BYTE datatype raw input '{spec.name}', the model must "
                       "have input shape [1]")
        raw = len(body).to_bytes(4, "little") + body  # one element, length-prefixed as BYTES travels
    else:
        raw = body
        if dynamic != -1:
            size = datatypes.ELEMENT_SIZE.get(spec.datatype, 1)
            shape[dynamic] = len(body) // count // size if count and size else 0
    return InferRequest(model_name, model_version, "", [InferTensor(spec.name, spec.datatype, shape, raw=raw)], None)


# ---- shared-memory extension: tensors in client regions (kernel/core/shared_memory.py)

# The per-output choice for an output that goes into a client region, not the body.
IN_SHARED_MEMORY = "shared_memory"


def _shm_input(
    inp, binary_size, shm: Optional[SharedMemoryManager], windows: RequestWindows
) -> InferTensor:
    if inp.data is not msgspec.UNSET or binary_size is not None:
        given = " 'data'" if inp.data is not msgspec.UNSET else ""
        given += " 'binary_data_size'" if binary_size is not None else ""
        raise _bad(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            f"'shared_memory_region' in 'parameters'. But set{given} 'shared_memory_region'"
        )
    if inp.datatype not in datatypes.DATATYPES:
        raise _bad(f"invalid datatype for input {inp.name}")
    region, offset, byte_size = _shm_parameters(inp.name, inp.parameters)
    window = windows.hold(_regions(shm).input(region, offset, byte_size))
    return InferTensor(inp.name, inp.datatype, inp.shape, raw=window)


def _shm_output(
    name: str, params: dict, shm: Optional[SharedMemoryManager], windows: RequestWindows
) -> OutputWindow:
    if "classification" in params:
        raise _bad("Output can't set both 'shared_memory_region' and 'classification'")
    if params.get("binary_data") is True:
        raise _bad("Output can't set both 'shared_memory_region' and 'binary_data'")
    region, offset, byte_size = _shm_parameters(name, params)
    return windows.hold(_regions(shm).output_window(region, offset, byte_size))


def _shm_parameters(tensor: str, params: dict) -> tuple[str, int, int]:
    """(region, offset, byte size) from a tensor's parameters, type-checked."""
    region = params["shared_memory_region"]
    if not isinstance(region, str):
        raise _bad("Unable to parse 'shared_memory_region': attempt to access JSON non-string as string")
    offset = params.get("shared_memory_offset", 0)
    if not _is_uint(offset):
        raise _bad(
            "Unable to parse 'shared_memory_offset': attempt to access JSON non-unsigned-integer as unsigned-integer"
        )
    byte_size = params.get("shared_memory_byte_size")
    if byte_size is None:
        raise _bad(
            f"'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
            f"for tensor '{tensor}'"
        )
    if not _is_uint(byte_size):
        raise _bad(
            "Unable to parse 'shared_memory_byte_size': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer"
        )
    return region, offset, byte_size


def _is_uint(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _regions(shm: Optional[SharedMemoryManager]) -> SharedMemoryManager:
    if shm is None:
        raise KernelError(ErrorCode.UNSUPPORTED, "shared memory is not supported on this endpoint")
    return shm


def json_data(tensor: InferTensor) -> list:
    """A tensor as the flat JSON list KServe v2 uses (BYTES as UTF-8 text)."""
    arr = tensor.as_numpy()
    if tensor.datatype == "BYTES":
        return json_strings(arr.reshape(-1))
    return arr.reshape(-1).tolist()


def json_strings(items) -> list:
    """BYTES elements as JSON text: UTF-8 where they are, else Latin-1."""
    out = []
    for item in items:
        if isinstance(item, (bytes, bytearray)):
            try:
                out.append(item.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(item.decode("latin-1"))
        else:
            out.append(str(item))
    return out


class LargeJson(Exception):
    """An output too large to write as JSON in one go on the event loop (see large_json)."""


# Outputs of more bytes than this that go out as JSON are encoded beside the loop (large_json).
INLINE_JSON_BYTES = 64 * 1024


def json_too_large(model: str, limit: int) -> KernelError:
    return _bad(f"the answer of model '{model}' would take more than {limit} bytes as JSON "
                "(--http-max-json-output-size); request its large outputs as binary data (the 'binary_data' "
                "output parameter, or the 'binary_data_output' request parameter)")


def encode_infer_response(
    response: InferResponse, binary_default: bool, binary_choice: dict[str, object],
    json_limit: Optional[int] = None,
) -> tuple[bytes | list, Optional[int]]:
    """Returns (body or body parts, JSON header length when binary data follows).

    json_limit: the most bytes the JSON may take (--http-max-json-output-size); with it, an
    output over INLINE_JSON_BYTES that goes out as JSON raises LargeJson (the caller has
    large_json encode the answer beside the loop), and a JSON header over the limit is refused.
    """
    outputs = []
    blobs = []
    for t in response.outputs:
        use_binary = binary_choice.get(t.name, binary_default)
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if use_binary is IN_SHARED_MEMORY:
            pass  # already written into the client's region: no data in the body
        elif use_binary:
            raw = t.raw
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            if json_limit is not None and t.nbytes > INLINE_JSON_BYTES:
                raise LargeJson(t.name)
            entry["data"] = json_data(t)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    header = _encoder.encode(doc)
    if json_limit is not None and len(header) > json_limit:
        raise json_too_large(response.model_name, json_limit)
    if not blobs:
        return header, None
    return [header, *blobs], len(header)


def encode_json(doc) -> bytes:
    return _encoder.encode(doc)


def error_body(message: str) -> bytes:
    return _encoder.encode({"error": message})
