"""KServe v2 gRPC messages <-> core requests and responses.

Nothing here knows which gRPC server library carries the messages: the
functions take and return google-protobuf (upb) message objects and raise
KernelError, which each binding turns into a gRPC status with `STATUS_CODES`.

Tensor data is passed through in wire form: `raw_input_contents` entries
already have the layout the core keeps (little-endian, BYTES elements with a
4-byte length prefix), so they become InferTensor.raw untouched, and output
bytes go straight into `raw_output_contents`. Only the typed `contents` lists
(used by hand-written clients, never by tritonclient) are converted.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Optional

import numpy as np

from kernel.core import datatypes
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import (
    REQUEST_FLAG_SEQUENCE_END,
    REQUEST_FLAG_SEQUENCE_START,
    InferRequest,
    InferResponse,
    InferTensor,
    RequestedOutput,
)
from kernel.core.shared_memory import RequestWindows, SharedMemoryManager
from kernel.transports import request_bounds
from kernel.transports.grpc import typed_contents
from kernel.transports.grpc.protos import grpc_service_pb2 as pb
from kernel.transports.grpc.stream_message import JOIN_BYTES, StreamMessage

# gRPC status codes (the numbers are part of the gRPC protocol).
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14

# Triton's mapping from error category to gRPC status.
STATUS_CODES = {
    ErrorCode.UNKNOWN: UNKNOWN,
    ErrorCode.INTERNAL: INTERNAL,
    ErrorCode.NOT_FOUND: NOT_FOUND,
    ErrorCode.INVALID_ARG: INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: UNAVAILABLE,
    ErrorCode.UNSUPPORTED: UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: ALREADY_EXISTS,
    ErrorCode.CANCELLED: CANCELLED,
}


def status_code(error: KernelError) -> int:
    return STATUS_CODES.get(error.code, UNKNOWN)


def _bad(message: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, message)


# ---------------------------------------------------------------- versions


def check_version(version: str) -> None:
    """Refuse a model version string the way tritonserver's gRPC endpoint does."""
    if not version:
        return
    try:
        number = int(version)
    except ValueError:
        raise _bad(
            f"failed to get model version from specified version string '{version}' "
            "(details: stol), version should be an integral value > 0"
        ) from None
    if number < 0:
        raise _bad(f"invalid model version specified '{version}' , version should be an integral value > 0")


# ---------------------------------------------------------------- parameters


def _param_value(key: str, p) -> object:
    """A request parameter as the model sees it (Python value in request.parameters())."""
    kind = p.WhichOneof("parameter_choice")
    if kind == "int64_param":
        return p.int64_param
    if kind == "bool_param":
        return p.bool_param
    if kind == "string_param":
        return p.string_param
    if kind == "double_param":
        return p.double_param
    raise _bad(f"invalid value type for '{key}' parameter, expected int64_param, bool_param, or string_param.")


# Request parameter keys starting with "triton_" that clients may use.
RESERVED_TRITON_PARAMS = ("triton_enable_empty_final_response",)


def _apply_parameters(request: InferRequest, params) -> bool:
    """Move control parameters onto the request; returns the empty-final-response choice."""
    model_params = request.parameters
    flags = 0
    empty_final = False
    for key, p in params.items():
        if key == "sequence_id":
            kind = p.WhichOneof("parameter_choice")
            if kind == "int64_param":
                request.correlation_id = p.int64_param
            elif kind == "string_param":
                request.correlation_id = p.string_param
            else:
                raise _bad("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")
        elif key == "sequence_start" or key == "sequence_end":
            if p.WhichOneof("parameter_choice") != "bool_param":
                raise _bad(f"invalid value type for '{key}' parameter, expected bool_param.")
            if p.bool_param:
                flags |= REQUEST_FLAG_SEQUENCE_START if key == "sequence_start" else REQUEST_FLAG_SEQUENCE_END
        elif key == "priority":
            kind = p.WhichOneof("parameter_choice")
            if kind == "int64_param":
                if p.int64_param < 0:
                    raise _bad("invalid value for 'priority', expected value >= 0.")
                request.priority = p.int64_param
            elif kind == "uint64_param":
                request.priority = p.uint64_param
            else:
                raise _bad("invalid value type for 'priority' parameter, expected int64_param or uint64_param.")
        elif key == "timeout":
            if p.WhichOneof("parameter_choice") != "int64_param":
                raise _bad("invalid value type for 'timeout' parameter, expected int64_param.")
            request.timeout_us = p.int64_param
        elif key.startswith("triton_"):
            if key not in RESERVED_TRITON_PARAMS:
                raise _bad(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                    "following keys starting with 'triton_' are allowed: " + " ".join(RESERVED_TRITON_PARAMS)
                )
            if p.WhichOneof("parameter_choice") != "bool_param":
                raise _bad(f"invalid value type for '{key}' parameter, expected bool_param.")
            empty_final = p.bool_param
        else:
            model_params[key] = _param_value(key, p)
    request.flags = flags
    return empty_final


def set_parameters(target, params: dict) -> None:
    """Fill a protobuf `map<string, InferParameter>` from a dict of Python values."""
    for key, value in params.items():
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            if value >= 1 << 63:
                p.uint64_param = value
            else:
                p.int64_param = value
        elif isinstance(value, float):
            p.double_param = value
        else:
            p.string_param = str(value)


# ---------------------------------------------------------------- typed contents

def _contents_tensor(io, model_name: str) -> InferTensor:
    contents = io.contents
    raw = typed_contents.contents_bytes(io.name, io.datatype, model_name,
                                        lambda field: (getattr(contents, field),) if getattr(contents, field) else None)
    return InferTensor(io.name, io.datatype, io.shape[:], raw=raw)


# ---------------------------------------------------------------- shared memory


def _shm_window(io, shm: Optional[SharedMemoryManager], windows: RequestWindows, output: bool = False):
    """What a tensor's shared_memory_* parameters name, or None if they name none: an input's bytes
    (a copy) or its InputWindow (read when the request is submitted), or an output's OutputWindow
    (kernel/core/shared_memory.py says why not a mapping)."""
    params = io.parameters
    region = params.get("shared_memory_region")
    if region is None:
        for key in ("shared_memory_offset", "shared_memory_byte_size"):
            if key in params:
                raise _bad(
                    f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor '{io.name}'"
                )
        return None
    _expect(io.name, "shared_memory_region", region, "string_param")
    offset = 0
    p = params.get("shared_memory_offset")
    if p is not None:
        offset = _expect(io.name, "shared_memory_offset", p, "int64_param")
    p = params.get("shared_memory_byte_size")
    if p is None:
        raise _bad(
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
            f"for tensor '{io.name}'"
        )
    byte_size = _expect(io.name, "shared_memory_byte_size", p, "int64_param")
    if shm is None:
        raise KernelError(ErrorCode.UNSUPPORTED, "shared memory is not supported on this endpoint")
    get = shm.output_window if output else shm.input
    return windows.hold(get(region.string_param, offset, byte_size))


def _expect(tensor: str, key: str, p, kind: str):
    if p.WhichOneof("parameter_choice") != kind:
        raise _bad(f"invalid value type for '{key}' parameter for tensor '{tensor}', expected {kind}.")
    return getattr(p, kind)


# ---------------------------------------------------------------- requests


# Top-level fields of a ModelInferRequest within request_bounds: its names and id, each
# parameter (a map entry each), each input, output and raw_input_contents.
_MAX_TOP_FIELDS = 8 + request_bounds.MAX_PARAMETERS + 3 * request_bounds.MAX_TENSORS


class SplitOff(NamedTuple):
    """What split_raw_inputs took out of a ModelInferRequest: its raw_input_contents (views of the
    message), and the large typed `contents` of its inputs by input index (views of their
    InferTensorContents serialization, made into bytes by typed_contents.LateContents)."""

    raws: list
    contents: dict


def split_raw_inputs(data) -> Optional[tuple[bytes, SplitOff]]:
    """A serialized ModelInferRequest's `raw_input_contents` as views of `data`, its inputs' large
    typed contents likewise, and the rest of it.

    Why: protobuf copies every bytes field twice (into its arena when it parses,
    into a new bytes object when the field is read): ~10 ms for a 16 MiB tensor;
    and it parses a typed list holding the GIL, element by element (typed_contents.py).
    Only the top level is walked (a handful of fields), and the inputs of
    typed_contents.CUT_BYTES or more one level further; the rest, with the
    inputs' names, shapes and parameters, is parsed by protobuf as before.
    None when `data` is not well-formed at the top level: the caller parses it
    whole and gets protobuf's own error; None too past _MAX_TOP_FIELDS fields
    (this walk is Python on the event loop: a million outputs took it 1 s), which
    the codec then refuses by request_bounds.
    """
    view = memoryview(data)
    keep_from = 0
    keep = []
    raws = []
    contents = {}
    inputs = 0
    fields = 0
    try:
        for tag_at, tag, start, end in typed_contents.walk_fields(view):
            fields += 1
            if fields > _MAX_TOP_FIELDS or start < 0:
                return None
            if tag == 0x3A:  # field 7, raw_input_contents
                keep.append(view[keep_from:tag_at])
                raws.append(view[start:end])
                keep_from = end
            elif tag == 0x2A:  # field 5, an input
                cut = typed_contents.cut_contents(view[start:end]) if end - start >= typed_contents.CUT_BYTES else None
                if cut is not None:
                    rest, contents[inputs] = cut
                    keep.append(view[keep_from:tag_at])
                    keep.append(b"\x2a" + typed_contents.encode_varint(len(rest)) + rest)
                    keep_from = end
                inputs += 1
    except IndexError:
        return None
    keep.append(view[keep_from:])
    return b"".join(keep), SplitOff(raws, contents)


# ModelInfer messages this large have their raw_input_contents (and large typed contents) taken out
# as views of the message before protobuf parses the rest (split_raw_inputs).
SPLIT_BYTES = 64 * 1024


def parse_infer_message(data) -> tuple[object, Optional[SplitOff]]:
    """A serialized ModelInferRequest as (message, what split_raw_inputs took out of it, or None),
    for every gRPC server Kernel runs on. Raises protobuf's DecodeError where it is not one."""
    split = split_raw_inputs(data) if len(data) >= SPLIT_BYTES else None
    if split is None:
        return pb.ModelInferRequest.FromString(data), None
    return pb.ModelInferRequest.FromString(split[0]), split[1]


def parse_infer_request(msg, shm: Optional[SharedMemoryManager] = None, split: Optional[SplitOff] = None
                        ) -> tuple[InferRequest, bool]:
    """ModelInferRequest -> (core request, whether an empty final response was asked for).

    `shm` holds the client's registered shared-memory regions; without it,
    tensors that name one are refused. `split`: what split_raw_inputs took out of
    the message (its raw_input_contents, its inputs' large typed contents).
    """
    model_name = msg.model_name
    request_bounds.check_tensors(len(msg.inputs), len(msg.outputs))  # (counted as each is read, below)
    parameters = len(msg.parameters)
    request_bounds.check_parameters(parameters)
    raw_contents = msg.raw_input_contents if split is None else split.raws
    late = split.contents if split is not None else None  # input index -> its typed contents, cut out
    n_raw = len(raw_contents)
    tensors = []
    index = 0
    windows = None  # client shared-memory windows, if any tensor uses one
    for i, io in enumerate(msg.inputs):
        cut = late.get(i) if late else None
        if len(io.shape) > request_bounds.MAX_DIMS:
            raise request_bounds.too_many_dims(io.name, len(io.shape))
        if io.parameters:
            parameters += len(io.parameters)
            request_bounds.check_parameters(parameters)
            windows = windows or RequestWindows()
            window = _shm_window(io, shm, windows)
            if window is not None:
                if cut is not None or io.HasField("contents"):
                    raise _bad(
                        f"unexpected 'content' provided when using shared memory for input tensor '{io.name}' "
                        f"for model '{model_name}'"
                    )
                tensors.append(InferTensor(io.name, io.datatype, io.shape[:], raw=window))
                continue
        if cut is not None or io.HasField("contents"):
            if n_raw:
                raise _bad(
                    f"contents field must not be specified when using raw_input_contents for '{io.name}' "
                    f"for model '{model_name}'"
                )
            if cut is not None:  # made into bytes beside the loop, before the request is admitted
                tensors.append(InferTensor(io.name, io.datatype, io.shape[:],
                                           raw=typed_contents.LateContents(cut, io.name, io.datatype, model_name)))
            else:
                tensors.append(_contents_tensor(io, model_name))
        elif index < n_raw:
            # (shape[:] makes a list: far cheaper than iterating the repeated field)
            tensors.append(InferTensor(io.name, io.datatype, io.shape[:], raw=raw_contents[index]))
            index += 1
        else:
            raise _bad(f"unable to find data for input tensor '{io.name}' for model '{model_name}' in request.")
    if index < n_raw:
        # tritonserver 2.51 uses the first ones and ignores the rest; an extra tensor's bytes were
        # received and buffered for nothing, and which bytes belong to which input is then a guess.
        raise _bad(f"{n_raw} raw_input_contents given for model '{model_name}', but only {index} of its "
                   "inputs take one (each input without shared memory or 'contents' takes the next)")
    outputs = None
    if msg.outputs:
        outputs = []
        for o in msg.outputs:
            oparams = None
            if o.parameters:
                parameters += len(o.parameters)
                request_bounds.check_parameters(parameters)
                windows = windows or RequestWindows()
                window = _shm_window(o, shm, windows, output=True)
                if window is not None:
                    if "classification" in o.parameters:
                        raise _bad("output can't set both 'shared_memory_region' and 'classification'")
                    windows.outputs[o.name] = window
                oparams = {k: _param_value(k, v) for k, v in o.parameters.items()}
            outputs.append(RequestedOutput(o.name, oparams))
    request = InferRequest(model_name, msg.model_version, msg.id, tensors, outputs)
    if windows is not None and windows.held:
        request.shm = windows
    if late:
        request.late_inputs = True
    empty_final = False
    if msg.parameters:
        empty_final = _apply_parameters(request, msg.parameters)
    return request, empty_final


# ---------------------------------------------------------------- responses
#
# Responses are serialized by hand rather than through message objects: the
# fields are few and fixed, the per-output metadata repeats from one response
# to the next (and is cached), and output bytes go from the core response into
# the wire message with a single copy (in the final join). The encoding is
# exactly what protobuf produces for the same ModelInferResponse: fields in
# number order, proto3 defaults (empty strings) left out;
# tests/test_grpc_codec.py checks it against the generated classes.

_varint = typed_contents.encode_varint


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: tag, length, bytes."""
    return tag + _varint(len(data)) + data


# Tags (field number << 3 | wire type 2) of the length-delimited fields used here.
_T1, _T2, _T3, _T4, _T5, _T6 = b"\x0a", b"\x12", b"\x1a", b"\x22", b"\x2a", b"\x32"

_output_meta: dict = {}
_model_prefix: dict = {}


def _output_field(name: str, datatype: str, shape: tuple) -> bytes:
    """ModelInferResponse field 5 (one InferOutputTensor without contents), cached."""
    key = (name, datatype, shape)
    hit = _output_meta.get(key)
    if hit is None:
        body = b""
        if name:
            body += _field(_T1, name.encode())
        if datatype:
            body += _field(_T2, datatype.encode())
        if shape:
            body += _field(_T3, b"".join(_varint(d) for d in shape))
        hit = _field(_T5, body)
        if len(_output_meta) >= 4096:
            _output_meta.clear()
        _output_meta[key] = hit
    return hit


def _prefix(model_name: str, model_version: str) -> bytes:
    """Fields 1 and 2 (model name and version), cached."""
    key = (model_name, model_version)
    hit = _model_prefix.get(key)
    if hit is None:
        hit = (_field(_T1, model_name.encode()) if model_name else b"") + (
            _field(_T2, model_version.encode()) if model_version else b""
        )
        if len(_model_prefix) >= 1024:
            _model_prefix.clear()
        _model_prefix[key] = hit
    return hit


def parameters_bytes(params: dict) -> bytes:
    """ModelInferResponse field 4 entries for a parameters dict (rare: built through protobuf)."""
    msg = pb.ModelInferResponse()
    set_parameters(msg.parameters, params)
    return msg.SerializeToString()


def _final_flag(value: bool) -> bytes:
    msg = pb.ModelInferResponse()
    msg.parameters["triton_final_response"].bool_param = value
    return msg.SerializeToString()


# the `triton_final_response` parameter of stream responses, serialized
FINAL_TRUE = _final_flag(True)
FINAL_FALSE = _final_flag(False)


def infer_response_parts(response: InferResponse, extra: bytes = b"") -> tuple[list, int]:
    """A successful core response as serialized ModelInferResponse pieces and their total size.

    Every output goes out as raw contents, as tritonserver sends them. `extra`
    is more field-4 bytes (a stream response's final flag).
    """
    parts = [_prefix(response.model_name, response.model_version)]
    rid = response.id
    if rid:
        parts.append(_field(_T3, rid.encode()))
    if response.parameters:
        parts.append(parameters_bytes(response.parameters))
    if extra:
        parts.append(extra)
    outputs = response.outputs
    if outputs:
        for t in outputs:
            parts.append(_output_field(t.name, t.datatype, t.shape))
        for t in outputs:
            raw = t.raw
            n = len(raw) if type(raw) is bytes else memoryview(raw).nbytes
            parts.append(_T6 + _varint(n))
            parts.append(raw)
    size = 0
    for p in parts:
        size += len(p) if type(p) is bytes else memoryview(p).nbytes
    return parts, size


def encode_infer_response(response: InferResponse) -> bytes:
    """A successful core response as a serialized ModelInferResponse."""
    parts, _ = infer_response_parts(response)
    return b"".join(parts)


def stream_response(response: InferResponse, final: bool):
    """ModelStreamInferResponse for a successful response, with Triton's final flag: bytes, or a
    StreamMessage when it is over JOIN_BYTES."""
    parts, size = infer_response_parts(response, FINAL_TRUE if final else FINAL_FALSE)
    head = _T2 + _varint(size)
    if size <= JOIN_BYTES:
        return b"".join([head, *parts])
    return StreamMessage([head, *parts], len(head) + size)


def stream_error(message: str, request_id: str, model_name: str = "", model_version: str = "",
                 final: Optional[bool] = None) -> bytes:
    """ModelStreamInferResponse carrying an error for one request (the stream goes on).

    A request refused outright names only its id; a failed response also
    names the model and carries the final flag, as Triton writes them.
    """
    inner = _prefix(model_name, model_version) + (_field(_T3, request_id.encode()) if request_id else b"")
    if final is not None:
        inner += FINAL_TRUE if final else FINAL_FALSE
    return (_field(_T1, message.encode()) if message else b"") + _field(_T2, inner)


def stream_empty_final(request_id: str, model_name: str, model_version: str) -> bytes:
    """The empty response that closes a decoupled request when the client asked for it."""
    inner = _prefix(model_name, model_version) + (_field(_T3, request_id.encode()) if request_id else b"")
    return _field(_T2, inner + FINAL_TRUE)


def fill_infer_response(msg, response: InferResponse) -> None:
    """Write a successful core response into an empty ModelInferResponse object.

    The reference for the hand-written encoding above (see the tests).
    """
    msg.model_name = response.model_name
    msg.model_version = response.model_version
    msg.id = response.id
    outputs = response.outputs
    if outputs:
        add = msg.outputs.add
        raws = []
        for t in outputs:
            add(name=t.name, datatype=t.datatype, shape=t.shape)
            raw = t.raw
            raws.append(raw if type(raw) is bytes else bytes(raw))
        msg.raw_output_contents.extend(raws)
    if response.parameters:
        set_parameters(msg.parameters, response.parameters)
