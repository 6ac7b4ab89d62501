"""KServe v2 HTTP inference bodies <-> core requests and responses.

The request body is a JSON header optionally followed by binary tensor data
(binary tensor data extension): `Inference-Header-Content-Length` says where
the JSON ends, and each binary input's `binary_data_size` parameter says how
many of the following bytes are its data, in input order.
"""

from __future__ import annotations

from typing import Any, Optional

import msgspec
import numpy as np

from kernel.core import datatypes
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor, RequestedOutput
from kernel.core.shared_memory import RequestWindows, SharedMemoryManager


class InputJSON(msgspec.Struct):
    name: str
    shape: list[int]
    datatype: str
    parameters: Optional[dict[str, Any]] = None
    data: Any = msgspec.UNSET


class OutputJSON(msgspec.Struct):
    name: str
    parameters: Optional[dict[str, Any]] = None


class RequestJSON(msgspec.Struct):
    inputs: list[InputJSON]
    id: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    outputs: Optional[list[OutputJSON]] = None


_request_decoder = msgspec.json.Decoder(RequestJSON)
_encoder = msgspec.json.Encoder()


def _bad(message: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, message)


def _decode_header(header) -> RequestJSON:
    try:
        return _request_decoder.decode(header)
    except msgspec.ValidationError as exc:
        raise _bad(f"Unable to parse inference request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise _bad(f"failed to parse the request JSON buffer: {exc}") from None
    except UnicodeDecodeError as exc:
        raise _bad(f"failed to parse the request JSON buffer: invalid UTF-8: {exc}") from None


def _json_tensor(inp: InputJSON) -> InferTensor:
    datatype = inp.datatype
    if datatype not in datatypes.DATATYPES:
        raise _bad(f"invalid datatype '{datatype}' for input '{inp.name}'")
    if any(d < 0 for d in inp.shape):
        raise _bad(f"invalid shape {inp.shape} for input '{inp.name}': dimensions must be >= 0")
    data = inp.data
    if data is msgspec.UNSET:
        raise _bad(f"must specify the 'data' field for input '{inp.name}'")
    count = datatypes.element_count(inp.shape)
    if datatype == "BYTES":
        flat = _flatten(data, inp.name)
        if len(flat) != count:
            raise _bad(
                f"unexpected number of string elements {len(flat)} for inference input '{inp.name}', expecting {count}"
            )
        arr = np.empty(count, dtype=np.object_)
        for i, item in enumerate(flat):
            if isinstance(item, str):
                arr[i] = item.encode("utf-8")
            else:
                raise _bad(f"expected string data for BYTES input '{inp.name}', got {type(item).__name__}")
        return InferTensor(inp.name, "BYTES", inp.shape, array=arr.reshape(inp.shape))
    if datatype == "BF16":
        raise _bad(f"BF16 input '{inp.name}' must be sent as binary data")
    dtype = datatypes.datatype_to_numpy(datatype)
    try:
        arr = np.array(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise _bad(f"unable to parse 'data' of input '{inp.name}' as {datatype}: {exc}") from None
    if arr.dtype == np.object_ or arr.size != count:
        raise _bad(
            f"unexpected number of elements {arr.size} for inference input '{inp.name}', expecting {count}"
            if arr.dtype != np.object_
            else f"'data' of input '{inp.name}' is not a uniform array"
        )
    if datatype == "BOOL" and not _all_bools(data):
        raise _bad(f"expected boolean data for BOOL input '{inp.name}'")
    return InferTensor(inp.name, datatype, inp.shape, array=arr.reshape(inp.shape))


def _all_bools(data) -> bool:
    if isinstance(data, list):
        return all(_all_bools(d) for d in data)
    return isinstance(data, bool)


def _flatten(data, name: str) -> list:
    if not isinstance(data, list):
        return [data]
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


def parse_infer_request(
    body: bytes, header_length: Optional[int], model_name: str, model_version: str,
    shm: Optional[SharedMemoryManager] = None,
) -> tuple[InferRequest, bool, dict[str, object]]:
    """Returns (request, binary outputs by default, per-output choice).

    The per-output choice is True/False for binary or JSON data, or
    IN_SHARED_MEMORY for an output written into a client region (`shm` holds
    the registered regions; without it shared-memory parameters are refused).
    """
    if header_length is None:
        header, binary = body, b""
    else:
        if header_length < 0 or header_length > len(body):
            raise _bad(
                f"Inference-Header-Content-Length {header_length} is larger than the request body ({len(body)} bytes)"
            )
        mv = memoryview(body)
        header, binary = mv[:header_length], mv[header_length:]
    req = _decode_header(header)
    tensors = []
    offset = 0
    windows: Optional[RequestWindows] = None  # client shared-memory windows, if any tensor uses one
    for inp in req.inputs:
        size = None
        if inp.parameters:
            size = inp.parameters.get("binary_data_size")
            if "shared_memory_region" in inp.parameters:
                windows = windows or RequestWindows()
                tensors.append(_shm_input(inp, size, shm, windows))
                continue
        if size is None:
            tensors.append(_json_tensor(inp))
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _bad(f"invalid binary_data_size for input '{inp.name}'")
        if inp.data is not msgspec.UNSET:
            raise _bad(f"input '{inp.name}' has both 'data' and binary data")
        if inp.datatype not in datatypes.DATATYPES:
            raise _bad(f"invalid datatype '{inp.datatype}' for input '{inp.name}'")
        if offset + size > len(binary):
            raise _bad(
                f"unexpected size for input '{inp.name}', expecting {size} bytes of binary data "
                f"but only {len(binary) - offset} bytes remain in the request body"
            )
        tensors.append(InferTensor(inp.name, inp.datatype, inp.shape, raw=binary[offset : offset + size]))
        offset += size
    if offset != len(binary):
        raise _bad(
            f"unexpected additional input data: the request body has {len(binary) - offset} bytes "
            "of binary data that no input claims"
        )
    params = dict(req.parameters) if req.parameters else {}
    binary_default = bool(params.pop("binary_data_output", False))
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
                binary_choice[o.name] = bool(oparams["binary_data"])
            outputs.append(RequestedOutput(o.name, oparams))
    request = InferRequest(model_name, model_version, req.id or "", tensors, outputs, params)
    request.shm = windows
    for key in ("sequence_id", "priority", "timeout"):
        if key in params:
            _apply_control_parameter(request, key, params)
    return request, binary_default, binary_choice


# ---- shared-memory extension: tensors in client regions (kernel/core/shared_memory.py)

# The per-output choice for an output that goes into a client region, not the body.
IN_SHARED_MEMORY = "shared_memory"


def _shm_input(
    inp: InputJSON, binary_size, shm: Optional[SharedMemoryManager], windows: RequestWindows
) -> InferTensor:
    if inp.data is not msgspec.UNSET or binary_size is not None:
        given = " 'data'" if inp.data is not msgspec.UNSET else ""
        given += " 'binary_data_size'" if binary_size is not None else ""
        raise _bad(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            f"'shared_memory_region' in 'parameters'. But set{given} 'shared_memory_region'"
        )
    if inp.datatype not in datatypes.DATATYPES:
        raise _bad(f"invalid datatype '{inp.datatype}' for input '{inp.name}'")
    region, offset, byte_size = _shm_parameters(inp.name, inp.parameters)
    window = windows.hold(_regions(shm).view(region, offset, byte_size))
    return InferTensor(inp.name, inp.datatype, inp.shape, raw=window)


def _shm_output(
    name: str, params: dict, shm: Optional[SharedMemoryManager], windows: RequestWindows
) -> memoryview:
    if "classification" in params:
        raise _bad("Output can't set both 'shared_memory_region' and 'classification'")
    if params.get("binary_data") is True:
        raise _bad("Output can't set both 'shared_memory_region' and 'binary_data'")
    region, offset, byte_size = _shm_parameters(name, params)
    return windows.hold(_regions(shm).view(region, offset, byte_size))


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


def _apply_control_parameter(request: InferRequest, key: str, params: dict) -> None:
    value = params.pop(key)
    if key == "sequence_id":
        request.correlation_id = value
        if params.pop("sequence_start", False):
            request.flags |= 1
        if params.pop("sequence_end", False):
            request.flags |= 2
    elif key == "priority":
        request.priority = int(value)
    elif key == "timeout":
        request.timeout_us = int(value)


def json_data(tensor: InferTensor) -> list:
    """A tensor as the flat JSON list KServe v2 uses (BYTES as UTF-8 text)."""
    arr = tensor.as_numpy()
    if tensor.datatype == "BYTES":
        out = []
        for item in arr.reshape(-1):
            if isinstance(item, (bytes, bytearray)):
                try:
                    out.append(item.decode("utf-8"))
                except UnicodeDecodeError:
                    out.append(item.decode("latin-1"))
            else:
                out.append(str(item))
        return out
    return arr.reshape(-1).tolist()


def encode_infer_response(
    response: InferResponse, binary_default: bool, binary_choice: dict[str, object]
) -> tuple[bytes | list, Optional[int]]:
    """Returns (body or body parts, JSON header length when binary data follows)."""
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
            entry["data"] = json_data(t)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    header = _encoder.encode(doc)
    if not blobs:
        return header, None
    return [header, *blobs], len(header)


def encode_json(doc) -> bytes:
    return _encoder.encode(doc)


def error_body(message: str) -> bytes:
    return _encoder.encode({"error": message})
