"""The gRPC codec in isolation: hand-serialized responses against the generated message classes."""

from __future__ import annotations

import numpy as np
import pytest

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferResponse, InferTensor
from kernel.transports.grpc import codec, stream_message
from kernel.transports.grpc.protos import grpc_service_pb2 as pb


def _reference(response: InferResponse, final=None) -> pb.ModelInferResponse:
    msg = pb.ModelInferResponse()
    codec.fill_infer_response(msg, response)
    if final is not None:
        msg.parameters["triton_final_response"].bool_param = final
    return msg


RESPONSES = [
    InferResponse("add_sub", "1", "", [InferTensor("OUTPUT0", "FP32", (4,), raw=b"\0" * 16)]),
    InferResponse("add_sub", "1", "req-7", [
        InferTensor("OUTPUT0", "FP32", (4,), raw=b"\1" * 16),
        InferTensor("OUTPUT1", "FP32", (4,), raw=b"\2" * 16),
    ]),
    InferResponse("m", "", "x" * 300, [InferTensor("EMPTY", "INT64", (0, 3), raw=b"")]),
    InferResponse("model-ü", "12", "id", [
        InferTensor("BIG", "UINT8", (1, 200, 70_000), raw=bytes(14_000_000)),
        InferTensor("S", "BYTES", (2,), raw=b"\x01\0\0\0a\x00\0\0\0"),
        InferTensor("SCALAR", "FP64", (), raw=np.float64(2.5).tobytes()),
    ]),
    InferResponse("p", "3", "", [], {"b": True, "f": False, "i": -5, "big": 2**63 + 5, "z": 0, "s": "text", "d": 1.25}),
    InferResponse("view", "1", "", [InferTensor.from_numpy("V", np.arange(10, dtype=np.int16))]),
]


@pytest.mark.parametrize("response", RESPONSES, ids=range(len(RESPONSES)))
def test_infer_response_matches_protobuf(response):
    ours = pb.ModelInferResponse.FromString(codec.encode_infer_response(response))
    assert ours == _reference(response)
    parts, size = codec.infer_response_parts(response)
    assert size == len(b"".join(parts))


@pytest.mark.parametrize("response", RESPONSES, ids=range(len(RESPONSES)))
@pytest.mark.parametrize("final", [False, True])
def test_stream_response_matches_protobuf(response, final):
    message = codec.stream_response(response, final)
    if isinstance(message, stream_message.StreamMessage):
        assert len(message) == len(message.joined())
        message = message.joined()
    ours = pb.ModelStreamInferResponse.FromString(message)
    assert ours.error_message == ""
    assert ours.infer_response == _reference(response, final)
    assert ours.infer_response.parameters["triton_final_response"].WhichOneof("parameter_choice") == "bool_param"


def test_a_large_stream_response_keeps_the_outputs_bytes_where_they_are():
    """Over stream_message.JOIN_BYTES a stream response is not joined (on the event loop, ~22 ms per 32
    MiB): its pieces end with the output's own buffer, which the native server frames as it lies."""
    out = np.arange(stream_message.JOIN_BYTES // 4 + 1, dtype=np.float32)
    response = InferResponse("m", "1", "r", [InferTensor.from_numpy("OUT", out)])
    message = codec.stream_response(response, True)
    assert isinstance(message, stream_message.StreamMessage)
    assert np.shares_memory(np.frombuffer(message.parts[-1], np.uint8), out)
    assert stream_message.pieces(message) is message.parts
    parsed = pb.ModelStreamInferResponse.FromString(message.joined())
    assert parsed.infer_response == _reference(response, True)
    small = codec.stream_response(RESPONSES[1], False)
    assert type(small) is bytes and stream_message.pieces(small) == [small]


def test_identical_bytes_for_a_plain_response():
    response = RESPONSES[1]
    assert codec.encode_infer_response(response) == _reference(response).SerializeToString()


@pytest.mark.parametrize("final", [None, False, True])
def test_stream_error(final):
    ours = pb.ModelStreamInferResponse.FromString(codec.stream_error("boom ü", "r1", "m", "2", final))
    expected = pb.ModelStreamInferResponse(error_message="boom ü")
    ir = expected.infer_response
    ir.id, ir.model_name, ir.model_version = "r1", "m", "2"
    if final is not None:
        ir.parameters["triton_final_response"].bool_param = final
    assert ours == expected
    assert ours.HasField("infer_response")


def test_refused_request_names_only_its_id():
    ours = pb.ModelStreamInferResponse.FromString(codec.stream_error("nope", ""))
    assert ours.error_message == "nope" and ours.HasField("infer_response")
    assert ours.infer_response == pb.ModelInferResponse()


def test_empty_final():
    ours = pb.ModelStreamInferResponse.FromString(codec.stream_empty_final("r", "m", ""))
    assert ours.infer_response.id == "r" and ours.infer_response.model_name == "m"
    assert len(ours.infer_response.outputs) == 0
    assert ours.infer_response.parameters["triton_final_response"].bool_param is True


def _request(**kw):
    I = pb.ModelInferRequest.InferInputTensor
    return pb.ModelInferRequest(
        model_name="m", inputs=[I(name="A", datatype="FP32", shape=[2, 2])], raw_input_contents=[b"\0" * 16], **kw
    )


def test_parse_request_control_parameters():
    msg = _request(id="q")
    msg.parameters["sequence_id"].string_param = "seq-1"
    msg.parameters["sequence_start"].bool_param = True
    msg.parameters["sequence_end"].bool_param = False
    msg.parameters["priority"].uint64_param = 3
    msg.parameters["timeout"].int64_param = 1000
    msg.parameters["triton_enable_empty_final_response"].bool_param = True
    msg.parameters["custom"].double_param = 0.5
    request, empty_final = codec.parse_infer_request(msg)
    assert empty_final is True
    assert request.id == "q" and request.model_name == "m"
    assert request.correlation_id == "seq-1" and request.flags == 1
    assert request.priority == 3 and request.timeout_us == 1000
    assert request.parameters == {"custom": 0.5}
    assert request.inputs[0].shape == (2, 2) and bytes(request.inputs[0].raw) == b"\0" * 16
    assert request.outputs is None


def test_parse_requested_outputs():
    msg = _request()
    o = msg.outputs.add(name="OUT")
    o.parameters["binary_data"].bool_param = True
    request, _ = codec.parse_infer_request(msg)
    assert [(r.name, r.parameters) for r in request.outputs] == [("OUT", {"binary_data": True})]
    o.parameters["classification"].int64_param = 2  # the classification extension (kernel/core/classification.py)
    request, _ = codec.parse_infer_request(msg)
    assert request.outputs[0].parameters == {"binary_data": True, "classification": 2}


@pytest.mark.parametrize(
    "datatype, field, values, expected",
    [
        ("INT8", "int_contents", [-1, 2], np.array([-1, 2], np.int8)),
        ("INT16", "int_contents", [-300, 2], np.array([-300, 2], np.int16)),
        ("INT32", "int_contents", [-1, 2**31 - 1], np.array([-1, 2**31 - 1], np.int32)),
        ("UINT8", "uint_contents", [255, 0], np.array([255, 0], np.uint8)),
        ("UINT16", "uint_contents", [65535], np.array([65535], np.uint16)),
        ("UINT32", "uint_contents", [2**32 - 1], np.array([2**32 - 1], np.uint32)),
        ("INT64", "int64_contents", [-(2**62)], np.array([-(2**62)], np.int64)),
        ("UINT64", "uint64_contents", [2**64 - 1], np.array([2**64 - 1], np.uint64)),
        ("FP32", "fp32_contents", [1.5], np.array([1.5], np.float32)),
        ("FP64", "fp64_contents", [1e300], np.array([1e300], np.float64)),
        ("BOOL", "bool_contents", [True, False], np.array([True, False])),
    ],
)
def test_typed_contents(datatype, field, values, expected):
    I = pb.ModelInferRequest.InferInputTensor
    msg = pb.ModelInferRequest(model_name="m", inputs=[I(name="X", datatype=datatype, shape=[len(values)])])
    getattr(msg.inputs[0].contents, field).extend(values)
    request, _ = codec.parse_infer_request(msg)
    assert bytes(request.inputs[0].raw) == expected.tobytes()


def test_bytes_contents_are_length_prefixed():
    I = pb.ModelInferRequest.InferInputTensor
    msg = pb.ModelInferRequest(model_name="m", inputs=[I(name="X", datatype="BYTES", shape=[3])])
    msg.inputs[0].contents.bytes_contents.extend([b"ab", b"", b"xyz"])
    request, _ = codec.parse_infer_request(msg)
    assert request.inputs[0].as_numpy().tolist() == [b"ab", b"", b"xyz"]


def test_fp16_has_no_typed_list():
    I = pb.ModelInferRequest.InferInputTensor
    msg = pb.ModelInferRequest(model_name="m", inputs=[I(name="X", datatype="FP16", shape=[1])])
    msg.inputs[0].contents.fp32_contents.append(1.0)
    with pytest.raises(KernelError) as info:
        codec.parse_infer_request(msg)
    assert "of type 'FP32', expected datatype 'FP16'" in info.value.message


def test_version_strings():
    codec.check_version("")
    codec.check_version("3")
    for bad in ("x", "1.5", "-2"):
        with pytest.raises(KernelError) as info:
            codec.check_version(bad)
        assert info.value.code is ErrorCode.INVALID_ARG


def test_status_mapping_is_tritons():
    assert {code.name: codec.status_code(KernelError(code, "")) for code in ErrorCode} == {
        "UNKNOWN": 2, "INTERNAL": 13, "NOT_FOUND": 5, "INVALID_ARG": 3, "UNAVAILABLE": 14,
        "UNSUPPORTED": 12, "ALREADY_EXISTS": 6, "CANCELLED": 1,
    }


def _big_request():
    I = pb.ModelInferRequest.InferInputTensor
    msg = pb.ModelInferRequest(
        model_name="m", model_version="2", id="req-1",
        inputs=[I(name="A", datatype="FP32", shape=[3]), I(name="B", datatype="BYTES", shape=[1]),
                I(name="C", datatype="UINT8", shape=[200_000])],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="OUT")],
        raw_input_contents=[np.arange(3, dtype=np.float32).tobytes(), b"\x02\x00\x00\x00hi", bytes(range(256)) * 781 + b"x" * 64],
    )
    msg.parameters["priority"].uint64_param = 3
    return msg


def test_split_raw_inputs_gives_views_and_the_same_message_without_them():
    msg = _big_request()
    data = msg.SerializeToString()
    rest, split = codec.split_raw_inputs(memoryview(data))
    raws = split.raws
    assert split.contents == {}  # (no typed contents here: tests/transports/test_grpc_typed_contents.py)
    assert [bytes(r) for r in raws] == list(msg.raw_input_contents)
    assert all(isinstance(r, memoryview) for r in raws)
    parsed = pb.ModelInferRequest.FromString(rest)
    expected = pb.ModelInferRequest()
    expected.CopyFrom(msg)
    del expected.raw_input_contents[:]
    assert parsed == expected
    request, _ = codec.parse_infer_request(parsed, None, split)
    assert [bytes(t.raw) for t in request.inputs] == list(msg.raw_input_contents)
    assert request.id == "req-1" and [t.name for t in request.inputs] == ["A", "B", "C"]


@pytest.mark.parametrize("cut", [1, 7, -1, -5])
def test_split_raw_inputs_refuses_a_truncated_message(cut):
    data = _big_request().SerializeToString()
    # cut inside a field: the caller parses it whole and gets protobuf's own error
    assert codec.split_raw_inputs(data[:cut]) is None


def test_split_raw_inputs_keeps_other_wire_types_and_unknown_fields():
    data = _big_request().SerializeToString() + b"\xa0\x06\x05" + b"\xad\x06\x01\x02\x03\x04"  # fields 100, 101
    rest, split = codec.split_raw_inputs(data)
    assert len(split.raws) == 3
    assert rest.endswith(b"\xa0\x06\x05\xad\x06\x01\x02\x03\x04")
    assert codec.split_raw_inputs(data + b"\x3b") is None  # field 7 with wire type 3 (a group): not ours
