"""The gRPC endpoint with the real tritonclient.grpc (sync and asyncio) against `kernel serve`."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as tc_model_config
from tritonclient.grpc import service_pb2 as tc_pb
from tritonclient.grpc import service_pb2_grpc as tc_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype
from conftest import ROOT


@pytest.fixture
def client(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        yield c


@pytest.fixture
def stub(server):
    """The raw service stub, for requests tritonclient never builds (typed contents, odd parameters)."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield tc_grpc.GRPCInferenceServiceStub(channel)


def _inputs(**arrays):
    out = []
    for name, arr in arrays.items():
        t = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def _http_json(server, path):
    with urllib.request.urlopen(f"http://{server.url}{path}") as r:
        return json.loads(r.read())


def _status(info) -> str:
    return info.value.status()


# ---------------------------------------------------------------- health and metadata


def test_health(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "7")
    assert not client.is_model_ready("no_such_model")


def test_grpc_health_service(server):
    """grpc.health.v1.Health/Check, which tritonserver answers too (Kubernetes gRPC probes use it)."""
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        # HealthCheckRequest{service: ""} is empty; HealthCheckResponse{status: SERVING (1)}
        assert check(b"", timeout=10) == b"\x08\x01"
        assert check(b"\x0a\x09inference", timeout=10) == b"\x08\x01"
    finally:
        channel.close()


def test_model_ready_refuses_a_malformed_version(client):
    with pytest.raises(InferenceServerException) as info:
        client.is_model_ready("add_sub", "abc")
    assert _status(info) == "StatusCode.INVALID_ARGUMENT"
    assert "failed to get model version from specified version string 'abc'" in info.value.message()


def test_server_metadata_matches_http(server, client):
    meta = client.get_server_metadata()
    doc = _http_json(server, "/v2")
    assert meta.name == doc["name"] == "triton"
    assert meta.version == doc["version"]
    assert list(meta.extensions) == doc["extensions"]


@pytest.mark.parametrize("model", ["add_sub", "string_identity", "dtype_echo", "repeat_int32"])
def test_model_metadata_matches_http(server, client, model):
    meta = client.get_model_metadata(model, as_json=True)
    doc = _http_json(server, f"/v2/models/{model}")
    # protobuf JSON renders int64 shapes as strings
    for io in meta.get("inputs", []) + meta.get("outputs", []):
        io["shape"] = [int(d) for d in io["shape"]]
    assert meta == doc


@pytest.mark.parametrize("model", ["add_sub", "string_identity", "auto_add", "repeat_int32"])
def test_model_config_matches_http(server, client, model):
    config = client.get_model_config(model).config
    from_http = json_format.ParseDict(
        _http_json(server, f"/v2/models/{model}/config"), tc_model_config.ModelConfig(), ignore_unknown_fields=False
    )
    assert config == from_http
    assert config.name == model


def test_model_config_for_a_version(client):
    assert client.get_model_config("add_sub", "1").config.name == "add_sub"


def test_statistics_match_http(server, client):
    a = np.ones(4, np.float32)
    client.infer("add_sub", _inputs(INPUT0=a, INPUT1=a))
    stats = client.get_inference_statistics("add_sub")
    from_http = json_format.ParseDict(_http_json(server, "/v2/models/add_sub/stats"), tc_pb.ModelStatisticsResponse())
    assert stats == from_http
    assert stats.model_stats[0].name == "add_sub"
    assert stats.model_stats[0].inference_stats.success.count >= 1
    everything = client.get_inference_statistics()
    assert "add_sub" in [m.name for m in everything.model_stats]
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics("no_such_model")
    assert "no_such_model" in info.value.message()


def test_metadata_and_config_of_unknown_model(client):
    for call in (client.get_model_metadata, client.get_model_config):
        with pytest.raises(InferenceServerException) as info:
            call("no_such_model")
        assert "Request for unknown model: 'no_such_model' is not found" in info.value.message()


# ---------------------------------------------------------------- inference


def test_add_sub_with_request_id(client):
    a = np.random.rand(4).astype(np.float32)
    b = np.random.rand(4).astype(np.float32)
    result = client.infer("add_sub", _inputs(INPUT0=a, INPUT1=b), request_id="42")
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    response = result.get_response()
    assert response.id == "42"
    assert response.model_name == "add_sub"
    assert response.model_version == "1"
    # Triton answers with raw contents, one per output, in output order
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert len(response.raw_output_contents) == 2


def test_requested_outputs_filter_the_response(client):
    a = np.ones(4, np.float32)
    result = client.infer(
        "add_sub", _inputs(INPUT0=a, INPUT1=a), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")]
    )
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros(4, np.float32))


def test_explicit_version(client):
    a = np.ones(4, np.float32)
    result = client.infer("add_sub", _inputs(INPUT0=a, INPUT1=a), model_version="1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_strings_round_trip(client):
    data = np.array([["hello", "wörld", "", "a b c"]], dtype=np.object_)
    t = grpcclient.InferInput("INPUT0", [1, 4], "BYTES")
    t.set_data_from_numpy(data)
    result = client.infer("string_identity", [t])
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (1, 4)
    assert [x.decode() for x in out.reshape(-1)] == ["hello", "wörld", "", "a b c"]


@pytest.mark.parametrize(
    "dtype",
    [np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
     np.float16, np.float32, np.float64, np.object_],
)
def test_every_dtype(client, dtype):
    triton_type = np_to_triton_dtype(np.dtype(dtype))
    name = "STRING" if triton_type == "BYTES" else triton_type
    rng = np.random.default_rng(0)
    if dtype == np.object_:
        data = np.array([b"x" * i for i in range(5)], dtype=np.object_)
    elif dtype == np.bool_:
        data = rng.integers(0, 2, 5).astype(dtype)
    else:
        data = rng.integers(0, 100, 5).astype(dtype)
    result = client.infer("dtype_echo", _inputs(**{f"IN_{name}": data}))
    out = result.as_numpy(f"OUT_{name}")
    assert out.dtype == data.dtype
    np.testing.assert_array_equal(out, data)
    assert result.get_output(f"OUT_{name}").datatype == triton_type


def test_several_inputs_and_outputs_at_once(client):
    arrays = {
        "IN_INT8": np.arange(-3, 3, dtype=np.int8),
        "IN_FP64": np.linspace(0, 1, 7),
        "IN_STRING": np.array([b"a", b"bc"], dtype=np.object_),
        "IN_BOOL": np.array([True, False, True]),
    }
    result = client.infer("dtype_echo", _inputs(**arrays))
    for name, data in arrays.items():
        np.testing.assert_array_equal(result.as_numpy("OUT_" + name[3:]), data)
    assert result.as_numpy("OUT_FP32") is None


@pytest.mark.parametrize("n", [70_000, 4_000_000])
def test_large_tensors(client, n):
    data = np.random.rand(n).astype(np.float32)  # up to 16 MB each way: past gRPC's default 4 MB limit
    result = client.infer("dtype_echo", _inputs(IN_FP32=data))
    np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)


def test_request_and_response_parameters(client):
    # (no double: a Python model may only put bool/int/str in response parameters)
    params = {"an_int": 7, "a_bool": True, "a_string": "text"}
    result = client.infer(
        "params_echo", _inputs(INPUT=np.array([1], np.int32)), parameters=params, priority=1, timeout=10_000_000
    )
    seen = json.loads(result.as_numpy("PARAMS_JSON")[0])
    assert seen == params  # priority and timeout are control parameters, not model parameters
    response = result.get_response()
    assert response.parameters["echoed_by"].string_param == "params_echo"
    assert response.parameters["an_int"].int64_param == 7
    assert response.parameters["a_bool"].bool_param is True
    assert response.parameters["a_string"].string_param == "text"


def test_typed_contents_inputs(stub):
    I = tc_pb.ModelInferRequest.InferInputTensor
    C = tc_pb.InferTensorContents
    request = tc_pb.ModelInferRequest(
        model_name="dtype_echo",
        id="typed",
        inputs=[
            I(name="IN_FP32", datatype="FP32", shape=[3], contents=C(fp32_contents=[1.5, 2.5, 3.5])),
            I(name="IN_INT8", datatype="INT8", shape=[3], contents=C(int_contents=[-1, 0, 127])),
            I(name="IN_UINT16", datatype="UINT16", shape=[2], contents=C(uint_contents=[1, 65535])),
            I(name="IN_INT64", datatype="INT64", shape=[2], contents=C(int64_contents=[-(2**40), 5])),
            I(name="IN_BOOL", datatype="BOOL", shape=[2], contents=C(bool_contents=[True, False])),
            I(name="IN_STRING", datatype="BYTES", shape=[2], contents=C(bytes_contents=[b"ab", b""])),
        ],
    )
    response = stub.ModelInfer(request)
    assert response.id == "typed"
    got = {o.name: (o.datatype, list(o.shape), raw) for o, raw in zip(response.outputs, response.raw_output_contents)}
    assert got["OUT_FP32"] == ("FP32", [3], np.array([1.5, 2.5, 3.5], np.float32).tobytes())
    assert got["OUT_INT8"] == ("INT8", [3], np.array([-1, 0, 127], np.int8).tobytes())
    assert got["OUT_UINT16"] == ("UINT16", [2], np.array([1, 65535], np.uint16).tobytes())
    assert got["OUT_INT64"] == ("INT64", [2], np.array([-(2**40), 5], np.int64).tobytes())
    assert got["OUT_BOOL"] == ("BOOL", [2], b"\x01\x00")
    assert got["OUT_STRING"] == ("BYTES", [2], b"\x02\x00\x00\x00ab\x00\x00\x00\x00")


def test_many_concurrent_requests_all_answered(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        results = {}

        def done(i, result, error):
            results[i] = (result, error)

        for i in range(200):
            a = np.full(4, i, np.float32)
            client.async_infer(
                "add_sub", _inputs(INPUT0=a, INPUT1=a), lambda result, error, i=i: done(i, result, error)
            )
        deadline = time.time() + 30
        while len(results) < 200 and time.time() < deadline:
            time.sleep(0.01)
        assert len(results) == 200
        for i, (result, error) in results.items():
            assert error is None
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full(4, 2 * i, np.float32))
    finally:
        client.close()


# ---------------------------------------------------------------- errors and status codes


def _infer_error(client, model, inputs, **kw):
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, inputs, **kw)
    return info


def test_unknown_model_is_not_found(client):
    info = _infer_error(client, "no_such_model", _inputs(INPUT0=np.ones(4, np.float32)))
    assert _status(info) == "StatusCode.NOT_FOUND"


def test_unknown_model(client):
    info = _infer_error(client, "no_such_model", _inputs(INPUT0=np.ones(4, np.float32)))
    assert "Request for unknown model: 'no_such_model' is not found" in info.value.message()


def test_unknown_version(client):
    a = np.ones(4, np.float32)
    info = _infer_error(client, "add_sub", _inputs(INPUT0=a, INPUT1=a), model_version="9")
    assert _status(info) == "StatusCode.NOT_FOUND"
    assert "version 9 is not found" in info.value.message()


def test_malformed_version(client):
    a = np.ones(4, np.float32)
    info = _infer_error(client, "add_sub", _inputs(INPUT0=a, INPUT1=a), model_version="x1")
    assert _status(info) == "StatusCode.INVALID_ARGUMENT"
    assert "version should be an integral value > 0" in info.value.message()


def test_wrong_shape(client):
    a = np.ones((2, 2), np.float32)
    info = _infer_error(client, "add_sub", _inputs(INPUT0=a, INPUT1=np.ones(4, np.float32)))
    assert _status(info) == "StatusCode.INVALID_ARGUMENT"
    assert "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [2,2]" in info.value.message()


def test_wrong_datatype(client):
    info = _infer_error(client, "add_sub", _inputs(INPUT0=np.ones(4, np.int32), INPUT1=np.ones(4, np.float32)))
    assert _status(info) == "StatusCode.INVALID_ARGUMENT"
    assert "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'" in info.value.message()


def test_missing_input(client):
    info = _infer_error(client, "add_sub", _inputs(INPUT0=np.ones(4, np.float32)))
    assert _status(info) == "StatusCode.INVALID_ARGUMENT"
    assert "missing required input(s) ['INPUT1']" in info.value.message()


def test_unknown_output(client):
    a = np.ones(4, np.float32)
    info = _infer_error(client, "add_sub", _inputs(INPUT0=a, INPUT1=a), outputs=[grpcclient.InferRequestedOutput("NOPE")])
    assert _status(info) == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == "unexpected inference output 'NOPE' for model 'add_sub'"  # Triton: no request id


def _raw_request(model="add_sub", raws=None, shapes=((4,), (4,)), **kw):
    I = tc_pb.ModelInferRequest.InferInputTensor
    a = np.ones(4, np.float32).tobytes()
    return tc_pb.ModelInferRequest(
        model_name=model,
        inputs=[I(name=f"INPUT{i}", datatype="FP32", shape=list(s)) for i, s in enumerate(shapes)],
        raw_input_contents=[a, a] if raws is None else raws,
        **kw,
    )


@pytest.mark.parametrize(
    "raws, message",
    [
        ([np.ones(4, np.float32).tobytes(), b"\0" * 8], "input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 16, got 8"),
        ([np.ones(4, np.float32).tobytes()], "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request."),
        ([], "unable to find data for input tensor 'INPUT0' for model 'add_sub' in request."),
    ],
    ids=["size-mismatch", "one-missing", "none"],
)
def test_raw_contents_mismatch(stub, raws, message):
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(_raw_request(raws=raws))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()


def test_contents_and_raw_contents_together(stub):
    request = _raw_request(raws=[np.ones(4, np.float32).tobytes()])
    request.inputs[0].contents.fp32_contents.extend([1, 2, 3, 4])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'add_sub'"
    )


@pytest.mark.parametrize(
    "field, message",
    [
        ("int_contents", "unexpected explicit tensor data for input tensor 'INPUT0' for model 'add_sub' of type 'INT32', expected datatype 'FP32'"),
        (None, "unexpected explicit tensor data for input tensor 'INPUT0' for model 'add_sub', binary data was already supplied."),
    ],
    ids=["wrong-list", "two-lists"],
)
def test_typed_contents_errors(stub, field, message):
    request = _raw_request(raws=[])
    for io in request.inputs:
        io.contents.fp32_contents.extend([1, 2, 3, 4])
    if field is None:
        request.inputs[0].contents.fp64_contents.extend([1, 2, 3, 4])
    else:
        request.inputs[0].contents.ClearField("fp32_contents")
        getattr(request.inputs[0].contents, field).extend([1, 2, 3, 4])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == message


@pytest.mark.parametrize(
    "key, kind, value, message",
    [
        ("triton_x", "bool_param", True, "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting with 'triton_' are allowed: triton_enable_empty_final_response"),
        ("custom", "uint64_param", 3, "invalid value type for 'custom' parameter, expected int64_param, bool_param, or string_param."),
        ("sequence_id", "bool_param", True, "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
        ("sequence_start", "int64_param", 1, "invalid value type for 'sequence_start' parameter, expected bool_param."),
        ("priority", "int64_param", -1, "invalid value for 'priority', expected value >= 0."),
        ("priority", "string_param", "high", "invalid value type for 'priority' parameter, expected int64_param or uint64_param."),
        ("timeout", "string_param", "x", "invalid value type for 'timeout' parameter, expected int64_param."),
    ],
)
def test_invalid_parameters(stub, key, kind, value, message):
    request = _raw_request()
    setattr(request.parameters[key], kind, value)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == message


def test_model_raising_is_internal(client):
    info = _infer_error(client, "raises", _inputs(INPUT0=np.ones(4, np.float32)))
    assert _status(info) == "StatusCode.INTERNAL"
    assert "this model always fails" in info.value.message()


def test_model_error_response_is_internal(client):
    info = _infer_error(client, "error_response", _inputs(INPUT0=np.ones(4, np.float32)))
    assert _status(info) == "StatusCode.INTERNAL"
    assert "the model refused this request" in info.value.message()


def test_decoupled_model_over_unary_call(client):
    info = _infer_error(client, "repeat_int32", _inputs(IN=np.array([1, 2], np.int32)))
    assert _status(info) == "StatusCode.UNIMPLEMENTED"
    assert info.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"


def test_unparsable_request_message(server):
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            call(b"\xff\xff\xff")
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert info.value.details() == "Unable to parse request"
        # On a stream, an unparsable message ends the client's side (as in gRPC C++ servers):
        # requests before it are answered and the call ends normally.
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        I = tc_pb.ModelInferRequest.InferInputTensor
        good = tc_pb.ModelInferRequest(
            model_name="repeat_int32", id="before", inputs=[I(name="IN", datatype="INT32", shape=[1])],
            raw_input_contents=[np.array([3], np.int32).tobytes()],
        ).SerializeToString()
        replies = [tc_pb.ModelStreamInferResponse.FromString(r)
                   for r in stream(iter([good, b"\xff\xff\xff", good]), timeout=10)]
        assert [r.infer_response.id for r in replies] == ["before"]
    finally:
        channel.close()


def test_unknown_method_is_unimplemented(server):
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        call = channel.unary_unary("/inference.GRPCInferenceService/NoSuchRpc")
        with pytest.raises(grpc.RpcError) as info:
            call(b"")
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        channel.close()


def test_repository_rpcs_follow_the_model_control_mode(client):
    """(The repository extension itself: tests/test_repository_api.py and tests/test_model_control.py.)"""
    assert "add_sub" in {m.name for m in client.get_model_repository_index().models}
    with pytest.raises(InferenceServerException) as info:
        client.load_model("add_sub")  # the default mode, none, loads nothing on request
    assert _status(info) == "StatusCode.UNAVAILABLE"


def test_shared_memory_tensor_naming_no_region_is_refused(stub):
    """(Shared-memory tensors themselves: tests/test_system_shared_memory.py.)"""
    request = _raw_request(raws=[np.ones(4, np.float32).tobytes()])
    request.inputs[1].parameters["shared_memory_region"].string_param = "region"
    request.inputs[1].parameters["shared_memory_byte_size"].int64_param = 16
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "Unable to find shared memory region: 'region'"


# ---------------------------------------------------------------- cancellation


def test_deadline_exceeded_cancels_the_request(server, client):
    tag = np.array([b"grpc-deadline"], dtype=np.object_)
    with pytest.raises(InferenceServerException) as info:
        client.infer("cancel_watcher", _inputs(TAG=tag), client_timeout=0.5)
    assert _status(info) == "StatusCode.DEADLINE_EXCEEDED"
    assert server.wait_for_log("cancel_watcher saw cancellation of grpc-deadline")


def test_client_cancelling_cancels_the_request(server):
    async def main():
        async with aioclient.InferenceServerClient(server.grpc_url) as c:
            tag = np.array([b"grpc-aio-cancel"], dtype=np.object_)
            t = aioclient.InferInput("TAG", [1], "BYTES")
            t.set_data_from_numpy(tag)
            task = asyncio.ensure_future(c.infer("cancel_watcher", [t]))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert server.wait_for_log("cancel_watcher saw cancellation of grpc-aio-cancel")


# ---------------------------------------------------------------- asyncio client


def test_aio_client(server):
    async def main():
        async with aioclient.InferenceServerClient(server.grpc_url) as c:
            assert await c.is_server_live()
            assert await c.is_server_ready()
            assert await c.is_model_ready("add_sub")
            meta = await c.get_model_metadata("add_sub")
            assert meta.name == "add_sub"
            config = await c.get_model_config("add_sub")
            assert config.config.name == "add_sub"

            async def one(i):
                a = np.full(4, i, np.float32)
                ins = []
                for name in ("INPUT0", "INPUT1"):
                    t = aioclient.InferInput(name, [4], "FP32")
                    t.set_data_from_numpy(a)
                    ins.append(t)
                r = await c.infer("add_sub", ins, request_id=str(i))
                assert r.get_response().id == str(i)
                return r.as_numpy("OUTPUT0")

            outs = await asyncio.gather(*(one(i) for i in range(64)))
            for i, out in enumerate(outs):
                np.testing.assert_array_equal(out, np.full(4, 2 * i, np.float32))
            with pytest.raises(InferenceServerException) as info:
                t = aioclient.InferInput("INPUT0", [4], "FP32")
                t.set_data_from_numpy(np.ones(4, np.float32))
                await c.infer("add_sub", [t])
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"

    asyncio.run(main())


# ---------------------------------------------------------------- protocol definition


def _descriptor_set(proto: str, tmp_path):
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc
    import grpc_tools
    from pathlib import Path

    root = ROOT
    out = tmp_path / "set.pb"
    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    assert protoc.main(["protoc", f"--proto_path={root}", f"--proto_path={include}",
                        f"--descriptor_set_out={out}", proto]) == 0
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return fds.file[0]


def test_service_definition_matches_tritonclient(tmp_path):
    """Every message, field (name, number, type, label, oneof) and rpc is Triton's."""
    pytest.importorskip("grpc_tools")
    from google.protobuf import descriptor_pb2

    ours = _descriptor_set("transports/grpc/protos/grpc_service.proto", tmp_path)
    theirs = descriptor_pb2.FileDescriptorProto.FromString(tc_pb.DESCRIPTOR.serialized_pb)
    assert ours.package == theirs.package == "inference"

    def shape(msg):
        fields = [(f.name, f.number, f.type, f.label, f.type_name, f.HasField("oneof_index") and f.oneof_index)
                  for f in msg.field]
        return (msg.name, fields, [o.name for o in msg.oneof_decl], [shape(n) for n in msg.nested_type],
                msg.options.map_entry)

    assert [shape(m) for m in ours.message_type] == [shape(m) for m in theirs.message_type]
    assert len(ours.service) == len(theirs.service) == 1
    rpcs = lambda s: [(m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming) for m in s.method]
    assert ours.service[0].name == theirs.service[0].name == "GRPCInferenceService"
    assert rpcs(ours.service[0]) == rpcs(theirs.service[0])


# ---------------------------------------------------------------- TLS


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for who in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={'localhost' if who == 'server' else who}",
                 "-keyout", f"{who}.key", "-out", f"{who}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", "ext.cnf", "-out", f"{who}.crt", cwd=d)
    return d


class _InProcessGrpc:
    """A core server with no models and only the gRPC transport, on a loop in a thread."""

    def __init__(self, repo, **settings):
        import threading

        from kernel.core.server import ServerOptions
        from kernel.serve.compose import compose_server
        from kernel.transports.grpc import GrpcTransport

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = compose_server(ServerOptions(model_repositories=[repo]), {})
        self.transport = GrpcTransport(self.server, "127.0.0.1", 0, **settings)

        async def start():
            await self.server.start()
            return await self.transport.start()

        address = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        self.port = int(address.rsplit(":", 1)[1])

    def close(self):
        asyncio.run_coroutine_threadsafe(self.transport.stop(), self.loop).result(30)
        asyncio.run_coroutine_threadsafe(self.transport.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_tls(certs, tmp_path):
    srv = _InProcessGrpc(tmp_path, use_ssl=True, server_cert=str(certs / "server.crt"),
                         server_key=str(certs / "server.key"))
    try:
        c = grpcclient.InferenceServerClient(f"localhost:{srv.port}", ssl=True,
                                             root_certificates=str(certs / "ca.crt"))
        assert c.is_server_live()
        c.close()
        plain = grpcclient.InferenceServerClient(f"localhost:{srv.port}")
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=3)
        plain.close()
    finally:
        srv.close()


def test_mutual_tls(certs, tmp_path):
    srv = _InProcessGrpc(tmp_path, use_ssl_mutual=True, server_cert=str(certs / "server.crt"),
                         server_key=str(certs / "server.key"), root_cert=str(certs / "ca.crt"))
    try:
        c = grpcclient.InferenceServerClient(
            f"localhost:{srv.port}", ssl=True, root_certificates=str(certs / "ca.crt"),
            private_key=str(certs / "client.key"), certificate_chain=str(certs / "client.crt"),
        )
        assert c.is_server_live()
        c.close()
        no_cert = grpcclient.InferenceServerClient(f"localhost:{srv.port}", ssl=True,
                                                   root_certificates=str(certs / "ca.crt"))
        with pytest.raises(InferenceServerException):
            no_cert.is_server_live(client_timeout=3)
        no_cert.close()
    finally:
        srv.close()


def test_tls_without_certificate_files_fails_to_start(tmp_path):
    from kernel.transports.grpc import GrpcOptions

    with pytest.raises(OSError):
        GrpcOptions(use_ssl=True).ssl_context()
    with pytest.raises(OSError):
        GrpcOptions(use_ssl=True, server_cert=str(tmp_path / "missing.crt"),
                    server_key=str(tmp_path / "missing.key")).ssl_context()


def test_options_from_command_line_namespace():
    import argparse

    from kernel.transports.grpc import GrpcOptions

    ns = argparse.Namespace(grpc_keepalive_time=1000, grpc_keepalive_timeout=500,
                            grpc_keepalive_permit_without_calls=True, grpc_http2_max_pings_without_data=0,
                            grpc_infer_allocation_pool_size=4, grpc_use_ssl=False, grpc_use_ssl_mutual=False,
                            grpc_server_cert="", grpc_server_key="", grpc_root_cert="")
    opts = GrpcOptions.from_args(ns)
    assert (opts.keepalive_time_ms, opts.keepalive_timeout_ms) == (1000, 500)
    assert opts.keepalive_permit_without_calls and opts.http2_max_pings_without_data == 0
    assert opts.infer_allocation_pool_size == 4 and not opts.ssl_enabled
    assert GrpcOptions.from_args(argparse.Namespace()) == GrpcOptions()
    assert GrpcOptions.from_args(argparse.Namespace(grpc_stream_write_interval_ms=0.0)).stream_write_interval_ms == 0
    with pytest.raises(ValueError):
        GrpcOptions(keepalive_time_ms=0)
    with pytest.raises(ValueError, match="--grpc-stream-write-interval-ms"):
        GrpcOptions(stream_write_interval_ms=-1)
