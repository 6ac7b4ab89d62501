"""--http-restricted-api / --grpc-restricted-protocol: restricted API groups answer 403 (HTTP) or
UNAVAILABLE (gRPC, as tritonserver does) with tritonserver's message unless the request carries the
configured header; everything else stays open."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, free_port, serving, wait_until_ok

ADMIN = {"admin-key": "secret"}
REPO_KEY = {"repo-key": "r"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "secret"}
GRPC_INFER = {"triton-grpc-protocol-infer-key": "let-me-in"}


@pytest.fixture(scope="module")
def kernel():
    yield from serving(
        [EXAMPLES],
        "--http-restricted-api=model-config,statistics,logging:admin-key=secret",
        "--http-restricted-api", "shared-memory,model-repository,trace:repo-key=r",
        "--grpc-restricted-protocol=model-config,statistics,health:admin-key=secret",
        "--grpc-restricted-protocol=inference,shared-memory,model-repository:infer-key=let-me-in",
    )


@pytest.fixture
def http(kernel):
    with httpclient.InferenceServerClient(kernel.url) as c:
        yield c


@pytest.fixture
def grpc_client(kernel):
    with grpcclient.InferenceServerClient(kernel.grpc_url) as c:
        yield c


def raw(kernel, path: str, method: str = "GET", headers=None, body: bytes | None = None):
    req = urllib.request.Request(f"http://{kernel.url}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def add_sub_inputs(module):
    out = []
    for name in ("INPUT0", "INPUT1"):
        t = module.InferInput(name, [4], "FP32")
        t.set_data_from_numpy(np.arange(4, dtype=np.float32))
        out.append(t)
    return out


def refused_http(call, header: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == "403"
    assert info.value.message() == f"This API is restricted, expecting header '{header}'"


def refused_grpc(call, header: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert info.value.message() == f"This protocol is restricted, expecting header '{header}'"


# ---- HTTP ---------------------------------------------------------------------------


def test_http_restricted_apis_refuse_without_the_header(http):
    refused_http(lambda: http.get_model_config("add_sub"), "admin-key")
    refused_http(lambda: http.get_inference_statistics("add_sub"), "admin-key")
    refused_http(lambda: http.get_inference_statistics(), "admin-key")
    refused_http(lambda: http.get_log_settings(), "admin-key")
    refused_http(lambda: http.get_trace_settings(), "repo-key")
    refused_http(lambda: http.get_trace_settings("add_sub"), "repo-key")
    refused_http(lambda: http.get_model_repository_index(), "repo-key")
    refused_http(lambda: http.get_system_shared_memory_status(), "repo-key")


def test_http_restricted_apis_answer_with_the_header(http):
    assert http.get_model_config("add_sub", headers=ADMIN)["name"] == "add_sub"
    stats = http.get_inference_statistics("add_sub", headers=ADMIN)
    assert stats["model_stats"][0]["name"] == "add_sub"
    assert http.get_log_settings(headers=ADMIN)["log_info"] is True
    assert http.get_trace_settings(headers=REPO_KEY)["trace_level"] == ["OFF"]
    assert http.get_system_shared_memory_status(headers=REPO_KEY) == []
    # Another group's header does not open this group.
    refused_http(lambda: http.get_model_config("add_sub", headers=REPO_KEY), "admin-key")


def test_http_header_value_must_match_exactly_but_its_name_is_case_insensitive(kernel):
    status, body = raw(kernel, "/v2/models/add_sub/config", headers={"admin-key": "Secret"})
    assert status == 403 and json.loads(body) == {"error": "This API is restricted, expecting header 'admin-key'"}
    status, body = raw(kernel, "/v2/models/add_sub/config", headers={"Admin-Key": "secret"})
    assert status == 200 and json.loads(body)["name"] == "add_sub"


def test_http_restriction_is_checked_before_the_method(kernel):
    # tritonserver refuses a restricted route before looking at the method.
    status, body = raw(kernel, "/v2/models/add_sub/config", method="PUT", body=b"")
    assert status == 403 and "expecting header 'admin-key'" in json.loads(body)["error"]
    status, _ = raw(kernel, "/v2/models/add_sub/config", method="PUT", headers=ADMIN, body=b"")
    assert status == 405


def test_http_unrestricted_apis_stay_open(kernel, http):
    assert http.is_server_live() and http.is_server_ready()
    assert http.is_model_ready("add_sub")
    assert http.get_server_metadata()["name"]
    assert http.get_model_metadata("add_sub")["name"] == "add_sub"
    result = http.infer("add_sub", add_sub_inputs(httpclient))
    assert result.as_numpy("OUTPUT0").tolist() == [0, 2, 4, 6]
    # Unknown routes are not restricted: still a plain 404.
    assert raw(kernel, "/v2/nothing/here")[0] == 404


# ---- gRPC ---------------------------------------------------------------------------


def test_grpc_restricted_protocols_refuse_without_the_header(grpc_client):
    header = "triton-grpc-protocol-admin-key"
    refused_grpc(lambda: grpc_client.get_model_config("add_sub"), header)
    refused_grpc(lambda: grpc_client.get_inference_statistics("add_sub"), header)
    refused_grpc(lambda: grpc_client.is_server_live(), header)
    refused_grpc(lambda: grpc_client.is_model_ready("add_sub"), header)
    header = "triton-grpc-protocol-infer-key"
    refused_grpc(lambda: grpc_client.infer("add_sub", add_sub_inputs(grpcclient)), header)
    refused_grpc(lambda: grpc_client.get_model_repository_index(), header)
    refused_grpc(lambda: grpc_client.get_cuda_shared_memory_status(), header)


def test_grpc_restricted_protocols_answer_with_the_header(grpc_client):
    assert grpc_client.get_model_config("add_sub", headers=GRPC_ADMIN).config.name == "add_sub"
    assert grpc_client.is_server_live(headers=GRPC_ADMIN)
    result = grpc_client.infer("add_sub", add_sub_inputs(grpcclient), headers=GRPC_INFER)
    assert result.as_numpy("OUTPUT1").tolist() == [0, 0, 0, 0]
    # The HTTP header name alone is not the gRPC one.
    refused_grpc(lambda: grpc_client.get_model_config("add_sub", headers=ADMIN), "triton-grpc-protocol-admin-key")


def test_grpc_unrestricted_protocols_stay_open(grpc_client):
    assert grpc_client.get_server_metadata().name
    assert grpc_client.get_model_metadata("add_sub").name == "add_sub"
    assert grpc_client.get_log_settings(as_json=True)["settings"]["log_info"]["bool_param"] is True
    assert grpc_client.get_trace_settings(as_json=True)["settings"]["trace_level"]["value"] == ["OFF"]


def test_grpc_stream_infer_is_restricted(grpc_client):
    results = []
    grpc_client.start_stream(callback=lambda result, error: results.append((result, error)))
    try:
        grpc_client.async_stream_infer("add_sub", add_sub_inputs(grpcclient))
    except InferenceServerException:
        pass  # the call may already have ended with the error, which the callback then has
    finally:
        grpc_client.stop_stream()
    assert len(results) == 1 and results[0][0] is None
    error = results[0][1]
    assert "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'" in str(error)

    results.clear()
    grpc_client.start_stream(callback=lambda result, error: results.append((result, error)), headers=GRPC_INFER)
    try:
        grpc_client.async_stream_infer("add_sub", add_sub_inputs(grpcclient))
    finally:
        grpc_client.stop_stream()
    assert len(results) == 1 and results[0][1] is None
    assert results[0][0].as_numpy("OUTPUT0").tolist() == [0, 2, 4, 6]


@pytest.fixture
def health_stub(kernel):
    channel = grpc.insecure_channel(kernel.grpc_url)
    yield channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
                              response_deserializer=lambda b: b)
    channel.close()


def test_grpc_health_check_is_restricted_with_health(health_stub):
    with pytest.raises(grpc.RpcError) as info:
        health_stub(b"")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.value.details() == "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    assert health_stub(b"", metadata=tuple(GRPC_ADMIN.items())) == b"\x08\x01"  # SERVING


# ---- the other gRPC server libraries apply the same restrictions -------------------------------


@pytest.mark.parametrize("library", ["grpclib", "grpcio"])
def test_grpc_libraries_apply_restrictions(start_kernel, library):
    k = start_kernel(
        [EXAMPLES], "--grpc-restricted-protocol=inference:k=v", "--allow-metrics=false",
        env={"KERNEL_GRPC_SERVER": library},
    ).wait_ready()
    client = grpcclient.InferenceServerClient(k.grpc_url)
    try:
        refused_grpc(lambda: client.infer("add_sub", add_sub_inputs(grpcclient)), "triton-grpc-protocol-k")
        result = client.infer("add_sub", add_sub_inputs(grpcclient), headers={"triton-grpc-protocol-k": "v"})
        assert result.as_numpy("OUTPUT0").tolist() == [0, 2, 4, 6]
        assert client.get_model_config("add_sub").config.name == "add_sub"  # not restricted
    finally:
        client.close()


def _refused_streams(url: str, times: int) -> list[str]:
    """Open `times` asyncio streams without the header; the error each one ends with."""
    import asyncio

    import tritonclient.grpc.aio as aioclient

    async def run() -> list[str]:
        errors = []
        async with aioclient.InferenceServerClient(url) as client:
            for _ in range(times):
                async def requests():
                    yield {"model_name": "add_sub", "inputs": add_sub_inputs(aioclient)}
                try:
                    async for _result, _error in client.stream_infer(requests()):
                        pass
                    errors.append("no error")
                except Exception as exc:  # noqa: BLE001 - what the client reports is the assertion
                    errors.append(f"{getattr(exc, 'code', lambda: None)()}: {getattr(exc, 'details', lambda: exc)()}")
        return errors

    return asyncio.run(run())


@pytest.mark.parametrize("library", ["native", "grpclib", "grpcio"])
def test_refused_streams_always_carry_the_restriction(start_kernel, library):
    # Refusing a stream before its first message raced the client's first send: grpcio's asyncio
    # client then reported INTERNAL "Internal error from Core" instead of the refusal.
    k = start_kernel([EXAMPLES], "--grpc-restricted-protocol=inference:k=v", "--allow-metrics=false",
                     env={"KERNEL_GRPC_SERVER": library}).wait_ready()
    expected = "StatusCode.UNAVAILABLE: This protocol is restricted, expecting header 'triton-grpc-protocol-k'"
    errors = _refused_streams(k.grpc_url, 60)
    assert errors == [expected] * 60


# ---- bad settings stop the server with tritonserver's message ----------------------------------


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--http-restricted-api=inference,bogus:k=v", "unknown restricted api 'bogus'"),
        ("--grpc-restricted-protocol=bogus:k=v", "unknown restricted protocol 'bogus'"),
        ("--http-restricted-api=inference", "--http-restricted-api option format is"),
        ("--grpc-restricted-protocol=inference:k=", "--grpc-restricted-protocol option format is"),
    ],
)
def test_bad_restriction_flags_stop_the_server(start_kernel, flag, message):
    k = start_kernel([EXAMPLES], flag)
    assert k.wait_exit(60) != 0
    assert message in k.log()


def test_an_api_in_two_groups_is_refused(start_kernel):
    k = start_kernel([EXAMPLES], "--http-restricted-api=inference:a=1", "--http-restricted-api=metadata,inference:b=2")
    assert k.wait_exit(60) != 0
    assert "restricted api 'inference' can not be specified in multiple config groups" in k.log()


# ---- the SageMaker and Vertex AI fronts follow --http-restricted-api, as in tritonserver ----------

ADD_SUB_JSON = {
    "inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]},
    ]
}


def _post(url: str, doc: dict, headers=None):
    req = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_sagemaker_invocations_follow_http_restrictions(start_kernel):
    port = free_port()
    k = start_kernel([EXAMPLES], "--allow-sagemaker=true", f"--sagemaker-port={port}",
                     "--http-restricted-api=inference:k=v", env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"})
    wait_until_ok(k, [f"http://localhost:{port}/ping"])  # /ping is in no group
    status, body = _post(f"http://localhost:{port}/invocations", ADD_SUB_JSON)
    assert (status, body) == (403, {"error": "This API is restricted, expecting header 'k'"})
    status, body = _post(f"http://localhost:{port}/invocations", ADD_SUB_JSON, {"k": "v"})
    assert status == 200 and body["outputs"][0]["data"] == [2, 3, 4, 5]


def test_vertex_redirects_follow_http_restrictions(start_kernel):
    port = free_port()
    health, predict = "/v1/endpoints/1/deployedModels/2", "/v1/endpoints/1/deployedModels/2:predict"
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port), "AIP_HEALTH_ROUTE": health,
           "AIP_PREDICT_ROUTE": predict}
    k = start_kernel([EXAMPLES], "--vertex-ai-default-model=add_sub", "--http-restricted-api=model-config:k=v",
                     env=env)
    wait_until_ok(k, [f"http://localhost:{port}{health}"])
    redirect = {"X-Vertex-Ai-Triton-Redirect": "v2/models/add_sub/config"}
    status, body = _post(f"http://localhost:{port}{predict}", {}, redirect)
    assert (status, body) == (403, {"error": "This API is restricted, expecting header 'k'"})
    status, body = _post(f"http://localhost:{port}{predict}", {}, {**redirect, "k": "v"})
    assert status == 200 and body["name"] == "add_sub"
    status, body = _post(f"http://localhost:{port}{predict}", ADD_SUB_JSON)  # inference is open
    assert status == 200
