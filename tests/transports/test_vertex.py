"""The Vertex AI endpoint: AIP_* environment, health and predict routes, X-Vertex-Ai-Triton-Redirect."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import EXAMPLES, TEST_MODELS, KernelProcess, copy_model, free_port, wait_until_ok

CLOUD = TEST_MODELS / "cloud"
MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
HEALTH = "/v1/endpoints/123/deployedModels/456"
PREDICT = "/v1/endpoints/123/deployedModels/456:predict"
REDIRECT = "X-Vertex-Ai-Triton-Redirect"

ADD_SUB_JSON = {
    "inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]},
    ]
}


def vertex_env(port: int, **extra) -> dict:
    return {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port), "AIP_HEALTH_ROUTE": HEALTH,
            "AIP_PREDICT_ROUTE": PREDICT, **extra}


def repo_with(tmp_path: Path, *models: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    for m in models:
        copy_model(m, repo)
    return repo


def wait_health(k, port: int) -> httpx.Client:
    wait_until_ok(k, [f"http://localhost:{port}{HEALTH}"])
    return httpx.Client(base_url=f"http://localhost:{port}", timeout=30)


def vertex(start_kernel, repos, *flags, **extra_env):
    port = free_port()
    k = start_kernel(repos, *flags, env=vertex_env(port, **extra_env))
    return k, wait_health(k, port)


def test_prediction_mode_serves_vertex_only(start_kernel, tmp_path):
    repo = repo_with(tmp_path, EXAMPLES / "add_sub")
    k, c = vertex(start_kernel, [repo])
    r = c.post(PREDICT, json=ADD_SUB_JSON)
    assert r.status_code == 200, r.text
    assert {o["name"]: o["data"] for o in r.json()["outputs"]} == {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}
    assert "Started Vertex AI HTTPService at 0.0.0.0:" in k.log()
    # AIP_MODE=PREDICTION turns the HTTP and gRPC endpoints off by default
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{k.url}/v2/health/ready", timeout=2)
    assert c.get(PREDICT).status_code == 405
    assert c.post(HEALTH).status_code == 405
    r = c.get("/somewhere/else")
    assert (r.status_code, r.content) == (400, b"")  # as tritonserver: no body


def test_predict_binary_tensor_data(start_kernel, tmp_path):
    repo = repo_with(tmp_path, EXAMPLES / "add_sub")
    _, c = vertex(start_kernel, [repo])
    a = np.arange(4, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    for t in inputs:
        t.set_data_from_numpy(a, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    r = c.post(PREDICT, content=body, headers={"Content-Type": f"{MIME}{json_size}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    result = httpclient.InferenceServerClient.parse_response_body(
        r.content, header_length=int(r.headers["inference-header-content-length"])
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_predict_bad_input_keeps_serving(start_kernel, tmp_path):
    repo = repo_with(tmp_path, EXAMPLES / "add_sub")
    _, c = vertex(start_kernel, [repo])
    r = c.post(PREDICT, content=b"{oops")  # tritonserver's words (RapidJSON's); 400, not its 500 (17843eb)
    assert (r.status_code, r.json()) == (400, {"error": "failed to parse the request JSON buffer: "
                                                        "Missing a name for object member. at 1"})
    r = c.post(PREDICT, content=b"{}", headers={"Content-Type": f"{MIME}x"})
    assert r.status_code == 400 and "Unable to parse inference header size" in r.json()["error"]
    assert c.post(PREDICT, json=ADD_SUB_JSON).status_code == 200


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One Vertex AI server (add_sub by default, text_echo too) for the redirect tests."""
    repo = repo_with(tmp_path_factory.mktemp("vertex"), EXAMPLES / "add_sub", CLOUD / "text_echo")
    port = free_port()
    k = KernelProcess([repo], "--vertex-ai-default-model=add_sub", env=vertex_env(port))
    try:
        c = wait_health(k, port)
        yield c
        c.close()
    finally:
        k.stop()


def test_redirect_reaches_other_kserve_endpoints(shared):
    c = shared

    def post(target, **kw):
        return c.post(PREDICT, headers={REDIRECT: target, **kw.pop("headers", {})}, **kw)

    r = post("v2/models/text_echo/infer",
             json={"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["hop"]}]})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == ["HOP"]
    r = post("v2/models/text_echo")
    assert r.status_code == 200 and r.json()["name"] == "text_echo"
    r = post("v2/models/text_echo/versions/1/config")
    assert r.status_code == 200 and r.json()["name"] == "text_echo"
    assert post("v2/models/add_sub/ready").status_code == 200
    r = post("v2/models/add_sub/stats")
    assert r.status_code == 200 and "model_stats" in r.json()
    assert post("v2/models/stats").status_code == 200
    assert post("v2/health/ready").status_code == 200
    assert post("v2/health/live").status_code == 200
    r = post("v2")
    assert r.status_code == 200 and "extensions" in r.json()
    # without the header, the default model
    assert c.post(PREDICT, json=ADD_SUB_JSON).json()["model_name"] == "add_sub"
    # a missing model, a redirect via GET
    r = post("v2/models/missing_model")
    assert r.status_code in (400, 404) and "missing_model" in r.json()["error"]
    assert c.get(PREDICT, headers={REDIRECT: "v2/models/add_sub"}).status_code == 405


def test_redirect_to_metrics_serves_the_metrics_page(shared):
    """tritonserver answers the redirect value 'metrics' with its Prometheus text; so does Kernel."""
    c = shared
    assert c.post(PREDICT, json=ADD_SUB_JSON).status_code == 200
    r = c.post(PREDICT, headers={REDIRECT: "metrics"}, content=b"ignored")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    assert "# TYPE nv_inference_request_success counter" in r.text
    assert 'nv_inference_request_success{model="add_sub",version="1"}' in r.text


@pytest.mark.parametrize(
    "target, status",
    [
        ("../v2/models/add_sub", 400),
        ("v2/models/../../etc/passwd", 400),
        ("v2/models/./add_sub", 400),
        ("/v2/models/add_sub", 400),
        ("http://example.com/v2/models/add_sub", 400),
        ("//example.com/v2", 400),
        ("v2/models/%2e%2e/infer", 400),
        ("v2/models/add_sub%2Finfer", 400),
        ("v2/models/add_sub?x=1", 400),
        ("/metrics", 400),
        ("v2/metrics", 400),
        ("v1/models/add_sub", 400),
        ("v2/nothing/here", 400),
        ("v2/models/add_sub/versions/abc", 400),
        ("v2/models/add_sub/generate", 400),
        ("", 400),
        ("v2/repository/models/add_sub/load", 403),
        ("v2/repository/models/add_sub/unload", 403),
        ("v2/systemsharedmemory/register", 403),
        ("v2/cudasharedmemory/region/r0/unregister", 403),
    ],
)
def test_redirect_refusals(shared, target, status):
    c = shared
    r = c.post(PREDICT, headers={REDIRECT: target}, json=ADD_SUB_JSON)
    assert r.status_code == status, r.text
    if status == 400:  # tritonserver answers a redirect it cannot serve with 400 and no body
        assert r.content == b""
    else:
        assert r.json()["error"]
    assert c.post(PREDICT, json=ADD_SUB_JSON).status_code == 200  # still serving


def test_several_models_need_a_default(start_kernel, tmp_path):
    repo = repo_with(tmp_path, EXAMPLES / "add_sub", CLOUD / "text_echo")
    port = free_port()
    k = start_kernel([repo], env=vertex_env(port))
    assert k.wait_exit(60) != 0
    assert "Expect the model repository contains only a single model if default model is not specified" in k.log()
    assert "--vertex-ai-default-model" in k.log()
    k2 = start_kernel([repo], "--vertex-ai-default-model=nope", env=vertex_env(free_port()))
    assert k2.wait_exit(60) != 0
    assert "Expect the default model 'nope' is loaded" in k2.log()
    _, c = vertex(start_kernel, [repo], "--vertex-ai-default-model=text_echo")
    r = c.post(PREDICT, json={"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["d"]}]})
    assert r.status_code == 200 and r.json()["model_name"] == "text_echo"


def test_storage_uri_local_and_cloud(start_kernel, tmp_path):
    repo = repo_with(tmp_path, EXAMPLES / "add_sub")
    _, c = vertex(start_kernel, [], AIP_STORAGE_URI=str(repo))
    assert c.post(PREDICT, json=ADD_SUB_JSON).status_code == 200
    k = start_kernel([], env=vertex_env(free_port(), AIP_STORAGE_URI="gs://my-bucket/models"))
    assert k.wait_exit(60) != 0
    log = k.log()
    assert "gs://my-bucket/models" in log and "not supported" in log
    assert "Traceback" not in log


def test_missing_routes_stop_start_up(start_kernel, tmp_path):
    repo = repo_with(tmp_path, EXAMPLES / "add_sub")
    env = vertex_env(free_port())
    del env["AIP_PREDICT_ROUTE"]
    k = start_kernel([repo], env=env)
    assert k.wait_exit(60) != 0
    assert "API_PREDICT_ROUTE is not defined for Vertex AI endpoint" in k.log()  # sic, as tritonserver


def test_flags_without_aip_mode(start_kernel, tmp_path):
    """The flag form (what a PyTriton-style TritonConfig(allow_vertex_ai=True, vertex_ai_port=...) maps onto)."""
    repo = repo_with(tmp_path, EXAMPLES / "add_sub")
    port = free_port()
    k = start_kernel([repo], "--allow-vertex-ai=true", f"--vertex-ai-port={port}", "--vertex-ai-thread-count=2",
                     env={"AIP_HEALTH_ROUTE": HEALTH, "AIP_PREDICT_ROUTE": PREDICT})
    k.wait_ready()  # HTTP stays on without AIP_MODE
    c = wait_health(k, port)
    assert c.post(PREDICT, json=ADD_SUB_JSON).status_code == 200
    assert httpx.get(f"http://{k.url}/v2/health/ready").status_code == 200
