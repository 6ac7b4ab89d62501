"""Large typed contents (`contents.fp32_contents`, `bytes_contents`, ...) cut out of a ModelInfer
message and made into bytes in pieces (transports/grpc/typed_contents.py) give exactly the bytes,
and the errors, that protobuf's whole parse gives: the same messages, both ways, compared."""

from __future__ import annotations

import shutil

import grpc
import numpy as np
import pytest

from conftest import ROOT, KernelProcess, running

from kernel.core.errors import KernelError
from kernel.transports.grpc import codec, typed_contents
from kernel.transports.grpc.protos import grpc_service_pb2 as pb

RNG = np.random.default_rng(7)
N = 300_000  # elements: past CUT_BYTES and several PIECE_BYTES for every type


def message(datatype: str, fill, **parameters) -> bytes:
    req = pb.ModelInferRequest(model_name="m", id="r")
    io = req.inputs.add(name="IN", datatype=datatype, shape=[N])
    fill(io.contents)
    req.inputs.add(name="SMALL", datatype="INT32", shape=[2]).contents.int_contents.extend([1, 2])
    for k, v in parameters.items():
        req.parameters[k].string_param = v
    return req.SerializeToString()


def both_ways(data: bytes):
    """(bytes or error text) of each input, parsed whole and parsed split."""
    def outcome(tensor):
        try:
            raw = tensor._raw.read() if isinstance(tensor._raw, typed_contents.LateContents) else tensor.raw
            return bytes(raw)
        except KernelError as exc:
            return f"{exc.code.name}: {exc.message}"

    def run(msg, split):
        try:
            request, _ = codec.parse_infer_request(msg, None, split)
        except KernelError as exc:
            return f"refused {exc.code.name}: {exc.message}"
        return [outcome(t) for t in request.inputs], request.late_inputs

    whole = run(pb.ModelInferRequest.FromString(data), None)
    head, split = codec.split_raw_inputs(data)
    assert len(head) < len(data) // 4  # the contents were cut out
    cut = run(pb.ModelInferRequest.FromString(head), split)
    return whole, cut


CASES = {
    "FP32": lambda c: c.fp32_contents.extend(RNG.standard_normal(N).astype(np.float32).tolist()),
    "FP64": lambda c: c.fp64_contents.extend(RNG.standard_normal(N).tolist()),
    "INT32": lambda c: c.int_contents.extend(RNG.integers(-2**31, 2**31, N).tolist()),
    "INT8": lambda c: c.int_contents.extend(RNG.integers(-2**31, 2**31, N).tolist()),  # narrowed: wraps
    "UINT16": lambda c: c.uint_contents.extend(RNG.integers(0, 2**32, N).tolist()),
    "INT64": lambda c: c.int64_contents.extend(RNG.integers(-2**63, 2**63 - 1, N).tolist()),
    "UINT64": lambda c: c.uint64_contents.extend(RNG.integers(0, 2**63, N).tolist()),
    "BOOL": lambda c: c.bool_contents.extend((RNG.integers(0, 2, N) == 1).tolist()),
    "BYTES": lambda c: c.bytes_contents.extend([bytes(RNG.integers(0, 256, RNG.integers(0, 9)).astype(np.uint8))
                                                for _ in range(N)]),
}


@pytest.mark.parametrize("datatype", sorted(CASES))
def test_each_type_gives_the_bytes_protobuf_gives(datatype):
    whole, cut = both_ways(message(datatype, CASES[datatype]))
    assert cut[1] is True and whole[1] is False  # made late, only when cut out
    assert cut[0] == whole[0] and type(whole[0][0]) is bytes and len(whole[0][0]) > 0


def test_refusals_keep_their_words():
    """Parsed whole, the request is refused as it is parsed; cut out, the same error comes when its
    bytes are made (before admission: the client gets it as its answer, kernel.core.admission)."""
    def two(c):
        c.fp32_contents.extend([1.0] * N)
        c.int_contents.extend([1])
    for fill, datatype in ((two, "FP32"), (CASES["FP32"], "INT32"), (CASES["INT64"], "INT16")):
        whole, cut = both_ways(message(datatype, fill))
        assert whole.startswith("refused INVALID_ARG: unexpected explicit tensor data"), whole
        assert cut[0][0] == whole[len("refused "):]


def test_a_malformed_list_is_a_parse_error_like_a_malformed_message():
    head, split = codec.split_raw_inputs(message("FP32", CASES["FP32"]))
    payload = bytes(split.contents[0])[:-3]  # the packed list cut short of its declared length
    late = typed_contents.LateContents(memoryview(payload), "IN", "FP32", "m")
    with pytest.raises(KernelError) as err:
        late.read()
    assert err.value.message == "Unable to parse request"
    with pytest.raises(Exception):
        pb.InferTensorContents.FromString(payload)  # protobuf refuses it too


@pytest.fixture(scope="module", params=["native", "grpclib", "grpcio"])
def server(request, tmp_path_factory):
    """Every gRPC server Kernel runs on parses infer messages the same way (codec.parse_infer_message)."""
    repo = tmp_path_factory.mktemp("typed-contents")
    shutil.copytree(ROOT / "benchmarks" / "model_repo_suite" / "identity_fp32", repo / "identity_fp32")
    yield from running(KernelProcess([repo], "--grpc-server", request.param))


def test_a_large_raw_input_comes_back_byte_for_byte(server):
    """A message past codec.SPLIT_BYTES, its tensor taken out as a view before protobuf parses the
    rest, unary and streamed, with a parameter after the tensor on the wire (what is kept is
    parsed in its order)."""
    data = RNG.integers(0, 2**32, size=(1 << 20) + 3, dtype=np.uint32).view(np.float32)  # 4 MiB + 12 B
    head = pb.ModelInferRequest(model_name="identity_fp32", id="big", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[data.size])]).SerializeToString()
    tail = pb.ModelInferRequest(parameters={"k": pb.InferParameter(string_param="v")}).SerializeToString()
    message = b"".join([head, b"\x3a", typed_contents.encode_varint(data.nbytes), data.tobytes(), tail])
    assert len(message) > codec.SPLIT_BYTES
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=options) as channel:
        unary = pb.ModelInferResponse.FromString(
            channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(message, timeout=60))
        streamed = pb.ModelStreamInferResponse.FromString(list(channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer")(iter([message, message]), timeout=60))[1])
    assert streamed.error_message == ""
    for answer in (unary, streamed.infer_response):
        assert answer.id == "big" and list(answer.outputs[0].shape) == [data.size]
        assert answer.raw_output_contents[0] == data.tobytes()


@pytest.mark.parametrize("kind", ["fp32_contents", "int_contents", "fp64_contents"])
def test_a_client_sees_the_same_answer_for_small_and_cut_out_contents(server, kind):
    """Unary and streamed, 4 elements (parsed whole) and 100,000 (cut out, made beside the loop):
    the same answer, or the same refusal in the same words."""
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=options) as channel:
        unary = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        seen = []
        for n in (4, 100_000):
            req = pb.ModelInferRequest(model_name="identity_fp32", id="x")
            getattr(req.inputs.add(name="INPUT0", datatype="FP32", shape=[n]).contents, kind).extend(
                [1.5] * n if kind.startswith("fp") else [1] * n)
            message = req.SerializeToString()
            try:
                answer = pb.ModelInferResponse.FromString(unary(message, timeout=60))
                got = [np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == [1.5] * n]
            except grpc.RpcError as exc:
                got = [exc.code(), exc.details()]
            streamed = pb.ModelStreamInferResponse.FromString(list(stream(iter([message]), timeout=60))[0])
            got.append(streamed.error_message or len(streamed.infer_response.raw_output_contents[0]) == 4 * n)
            seen.append(got)
    assert seen[0] == seen[1]
    if kind == "fp32_contents":
        assert seen[0] == [True, True]
    else:
        assert seen[0][0] == grpc.StatusCode.INVALID_ARGUMENT and "unexpected explicit tensor data" in seen[0][1]


def test_a_group_in_the_contents_leaves_the_rest_to_protobuf_in_order():
    """A group (wire type 3, which protobuf keeps as an unknown field) after some bytes_contents
    and before others: the elements come out in order, as protobuf's whole parse gives them."""
    before = [bytes([i % 256]) * (i % 7) for i in range(20_000)]
    after = [b"after-%d" % i for i in range(20_000)]
    c = pb.InferTensorContents(bytes_contents=before).SerializeToString()
    c += b"\x4b" + b"\x08\x01" + b"\x4c"  # field 9: start group, a varint field inside, end group
    c += pb.InferTensorContents(bytes_contents=after).SerializeToString()
    whole = pb.InferTensorContents.FromString(c)
    assert list(whole.bytes_contents) == before + after
    late = typed_contents.LateContents(memoryview(c), "IN", "BYTES", "m")
    expected = b"".join(len(v).to_bytes(4, "little") + v for v in before + after)
    assert late.read() == expected


@pytest.mark.parametrize("cut", [1, 5, 1 << 20], ids=["last byte", "inside a later field", "inside the tensor"])
def test_a_large_malformed_message_is_a_parse_error_and_the_server_goes_on(server, cut):
    """Past codec.SPLIT_BYTES the message is walked before protobuf sees it: one cut short is
    refused as protobuf's parse refuses it, on every server, and the next request is answered."""
    data = np.arange(1 << 20, dtype=np.float32)
    head = pb.ModelInferRequest(model_name="identity_fp32", id="cut", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[data.size])]).SerializeToString()
    tail = pb.ModelInferRequest(parameters={"k": pb.InferParameter(string_param="v")}).SerializeToString()
    whole = b"".join([head, b"\x3a", typed_contents.encode_varint(data.nbytes), data.tobytes(), tail])
    message = whole[:-cut]
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=options) as channel:
        unary = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as refused:
            unary(message, timeout=60)
        assert refused.value.code() == grpc.StatusCode.INTERNAL and refused.value.details() == "Unable to parse request"
        # On a stream, an unparsable message ends the reading side; what came before it is answered.
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        answers = list(stream(iter([whole, message]), timeout=60))
        assert len(answers) == 1 and pb.ModelStreamInferResponse.FromString(answers[0]).error_message == ""
        answer = pb.ModelInferResponse.FromString(unary(whole, timeout=60))
        assert answer.raw_output_contents[0] == data.tobytes()
