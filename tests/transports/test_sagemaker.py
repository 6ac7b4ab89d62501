"""The SageMaker endpoint (kernel serve --allow-sagemaker) and its serve entry point, with real HTTP clients."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import EXAMPLES, ROOT, TEST_MODELS, KernelProcess, copy_model, free_port, wait_until_ok

CLOUD = TEST_MODELS / "cloud"
BAD = TEST_MODELS / "bad"
MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="

ADD_SUB_JSON = {
    "inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]},
    ]
}


def text_request(text: str, **extra) -> dict:
    inputs = [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [text]}]
    for name, value in extra.items():
        inputs.append({"name": name, "shape": [1], "datatype": "INT32", "data": [value]})
    return {"inputs": inputs}


def sagemaker(start_kernel, repos, *flags, env=None):
    port = free_port()
    k = start_kernel(repos, "--allow-sagemaker=true", f"--sagemaker-port={port}", *flags, env=env)
    wait_until_ok(k, [f"http://localhost:{port}/ping"])
    return k, httpx.Client(base_url=f"http://localhost:{port}", timeout=30)


def repo_with(tmp_path: Path, *models: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    for m in models:
        copy_model(m, repo)
    return repo


def add_sub_outputs(body: dict) -> dict:
    return {o["name"]: o["data"] for o in body["outputs"]}


# ---- single-model endpoint ------------------------------------------------------------


def test_ping_and_invocations(start_kernel, tmp_path):
    repo = repo_with(tmp_path, EXAMPLES / "add_sub", CLOUD / "text_echo")
    k, c = sagemaker(start_kernel, [repo], env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"})
    assert c.get("/ping").status_code == 200
    assert c.post("/ping").status_code == 405
    r = c.post("/invocations", json=ADD_SUB_JSON)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert add_sub_outputs(r.json()) == {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}
    assert r.json()["model_name"] == "add_sub"
    assert c.get("/invocations").status_code == 405
    assert "Started Sagemaker HTTPService at 0.0.0.0:" in k.log()
    # the KServe v2 HTTP endpoint is still there
    assert httpx.get(f"http://{k.url}/v2/health/ready").status_code == 200


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One SageMaker server serving add_sub, for the tests that only send requests."""
    repo = repo_with(tmp_path_factory.mktemp("sagemaker"), EXAMPLES / "add_sub")
    port = free_port()
    k = KernelProcess([repo], "--allow-sagemaker=true", f"--sagemaker-port={port}",
                      env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"})
    try:
        wait_until_ok(k, [f"http://localhost:{port}/ping"])
        with httpx.Client(base_url=f"http://localhost:{port}", timeout=30) as c:
            yield c
    finally:
        k.stop()


def test_invocations_binary_tensor_data(shared):
    c = shared
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 2, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    r = c.post("/invocations", content=body, headers={"Content-Type": f"{MIME}{json_size}"})
    assert r.status_code == 200, r.text
    content_type = r.headers["content-type"]
    assert content_type.startswith(MIME)
    assert "inference-header-content-length" not in r.headers
    result = httpclient.InferenceServerClient.parse_response_body(r.content, header_length=int(content_type[len(MIME):]))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize(
    "content, headers, status, message",
    [
        # tritonserver 2.51's words with RapidJSON's byte offset; 400 where it answers 500 (a client mistake)
        (b"{not json", {}, 400, "failed to parse the request JSON buffer: Missing a name for object member. at 1"),
        (b"xyz", {}, 400, "failed to parse the request JSON buffer: Invalid value. at 0"),
        (b"not json", {}, 400, "failed to parse the request JSON buffer: Invalid value. at 1"),
        (json.dumps({"inputs": [{"name": "NOPE", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).encode(),
         {}, 400, "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['NOPE']"),
        (b"{}", {"Content-Type": f"{MIME}abc"}, 400, "Unable to parse inference header size"),
        (b"{}", {"Content-Type": f"{MIME}999"}, 400, "inference header size should be in range"),
        (b"{}", {"Content-Type": f"text/plain; {MIME}2"}, 400, "expect MIME type for binary data starts with"),
    ],
)
def test_invocations_bad_input(shared, content, headers, status, message):
    c = shared
    r = c.post("/invocations", content=content, headers=headers)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    assert c.post("/invocations", json=ADD_SUB_JSON).status_code == 200  # still serving


def test_invocations_model_errors_and_out_of_memory(start_kernel, tmp_path):
    repo = repo_with(tmp_path, CLOUD / "text_echo")
    _, c = sagemaker(start_kernel, [repo])  # the only model serves /invocations
    r = c.post("/invocations", json=text_request("fine"))
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == ["FINE"]
    r = c.post("/invocations", json=text_request("error"))
    assert r.status_code == 500 and "asked to fail" in r.json()["error"]
    r = c.post("/invocations", json=text_request("oom"))
    assert r.status_code == 507 and "out of memory" in r.json()["error"]
    assert c.get("/ping").status_code == 200


def test_default_model_selection(start_kernel, tmp_path):
    one = repo_with(tmp_path, CLOUD / "text_echo")
    k, c = sagemaker(start_kernel, [one])
    assert "No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided" in k.log()
    assert c.post("/invocations", json=text_request("x")).status_code == 200

    two = tmp_path / "two"
    two.mkdir()
    copy_model(CLOUD / "text_echo", two)
    copy_model(EXAMPLES / "add_sub", two)
    k2, c2 = sagemaker(start_kernel, [two])
    r = c2.post("/invocations", json=text_request("x"))  # tritonserver's status and words
    assert (r.status_code, r.json()) == (
        404, {"error": "Request for unknown model: 'unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME' is not found"})

    k3 = start_kernel([two], "--allow-sagemaker=true", f"--sagemaker-port={free_port()}",
                      env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "missing_model"})
    assert k3.wait_exit(60) != 0
    assert "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is 'missing_model'" in k3.log()
    assert "Traceback" not in k3.log()


def test_safe_port_range(start_kernel, tmp_path):
    repo = repo_with(tmp_path, CLOUD / "text_echo")
    k = start_kernel([repo], "--allow-sagemaker=true", f"--sagemaker-port={free_port()}",
                     "--sagemaker-safe-port-range=1-2")
    assert k.wait_exit(60) != 0
    assert f"The server cannot listen to HTTP requests at port {k.http_port}, allowed port range is [1, 2]" in k.log()
    port = free_port()
    k2 = start_kernel([repo], "--allow-sagemaker=true", f"--sagemaker-port={port}", f"--http-port={port}")
    assert k2.wait_exit(60) != 0
    assert "at the same address and port" in k2.log()
    # a range that holds every other port is fine
    k3 = start_kernel([repo], "--allow-sagemaker=true", f"--sagemaker-port={free_port()}",
                      "--sagemaker-safe-port-range=1024-65535", "--sagemaker-thread-count=4")
    k3.wait_ready()


# ---- streaming ----------------------------------------------------------------------------


def sse_events(text: str) -> list[dict]:
    return [json.loads(chunk[len("data: "):]) for chunk in text.split("\n\n") if chunk.strip()]


def test_invocations_response_stream(start_kernel, tmp_path):
    repo = repo_with(tmp_path, CLOUD / "token_stream")
    k, c = sagemaker(start_kernel, [repo])
    r = c.post("/invocations-response-stream", json=text_request("a FAIL b"))
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = sse_events(r.text)
    assert len(events) == 3
    assert events[0]["model_name"] == "token_stream"
    assert {o["name"]: o["data"] for o in events[0]["outputs"]} == {"text_output": ["a"], "index": [0]}
    assert events[1] == {"error": "word 1 is FAIL"}
    assert {o["name"]: o["data"] for o in events[2]["outputs"]}["text_output"] == ["b"]
    # errors before inference are plain JSON
    r = c.post("/invocations-response-stream", content=b"{bad")  # malformed JSON: 400 with tritonserver's words
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"

    words = " ".join(f"w{i}" for i in range(40))
    with httpx.stream("POST", f"{c.base_url}/invocations-response-stream",
                      json=text_request(f"smcancel {words}", delay_ms=250), timeout=30) as s:
        first = next(line for line in s.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["outputs"][0]["data"] == ["smcancel"]
    assert k.wait_for_log("token_stream saw cancellation of 'smcancel'", timeout=15)


@pytest.mark.parametrize("inference_type", ["generate", "generate_stream"])
def test_inference_type_generate(start_kernel, tmp_path, inference_type):
    repo = repo_with(tmp_path, CLOUD / "token_stream")
    _, c = sagemaker(start_kernel, [repo], env={"SAGEMAKER_TRITON_INFERENCE_TYPE": inference_type})
    r = c.post("/invocations", json={"text_input": "x y" if inference_type == "generate_stream" else "x"})
    assert r.status_code == 200, r.text
    if inference_type == "generate":
        assert r.json()["text_output"] == "x"
    else:
        assert [e["text_output"] for e in sse_events(r.text)] == ["x", "y"]
    r = c.post("/invocations-response-stream", json={"text_input": "p q"})
    assert [e["text_output"] for e in sse_events(r.text)] == ["p", "q"]


def test_invalid_inference_type_stops_start_up(start_kernel, tmp_path):
    repo = repo_with(tmp_path, CLOUD / "text_echo")
    k = start_kernel([repo], "--allow-sagemaker=true", f"--sagemaker-port={free_port()}",
                     env={"SAGEMAKER_TRITON_INFERENCE_TYPE": "bogus"})
    assert k.wait_exit(60) != 0
    assert "Invalid SAGEMAKER_TRITON_INFERENCE_TYPE 'bogus'" in k.log()


# ---- multi-model endpoint -------------------------------------------------------------


def write_oom_model(path: Path) -> Path:
    (path / "1").mkdir(parents=True)
    (path / "config.pbtxt").write_text(
        'backend: "python"\ninput [{ name: "X", data_type: TYPE_INT32, dims: [ 1 ] }]\n'
        'output [{ name: "Y", data_type: TYPE_INT32, dims: [ 1 ] }]\n'
    )
    (path / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise MemoryError('CUDA out of memory while loading weights')\n"
    )
    return path


def test_multi_model_load_invoke_unload(start_kernel, tmp_path):
    empty = tmp_path / "empty_repo"
    empty.mkdir()
    store = tmp_path / "opt_ml_models"
    add_sub_url = copy_model(EXAMPLES / "add_sub", store / "hash1", "model")  # a model folder
    echo_repo = store / "hash2" / "model"  # a repository holding one model folder
    echo_repo.mkdir(parents=True)
    copy_model(CLOUD / "text_echo", echo_repo)
    k, c = sagemaker(start_kernel, [empty], env={"SAGEMAKER_MULTI_MODEL": "true"})
    assert c.get("/models").json() == {"models": []}

    r = c.post("/models", json={"model_name": "hash1", "url": str(add_sub_url)})
    assert r.status_code == 200, r.text
    r = c.post("/models", json={"model_name": "echo", "url": str(echo_repo)},
               headers={"X-Amzn-SageMaker-Target-Model": "echo.tar.gz"})
    assert r.status_code == 200, r.text
    listing = c.get("/models").json()["models"]
    # SageMaker's <hash>/model naming the model itself: tritonserver registers <hash> and reports it
    # (its QA expects the url less '/model'); a repository holding the model: the url as given
    assert {m["modelName"]: m["modelUrl"] for m in listing} == {"hash1": str(store / "hash1"), "echo": str(echo_repo)}
    assert c.get("/models/hash1").json() == {"modelName": "hash1", "modelUrl": str(store / "hash1")}
    assert c.get("/models/nope").status_code == 404

    r = c.post("/models/hash1/invoke", json=ADD_SUB_JSON)
    assert r.status_code == 200, r.text
    assert add_sub_outputs(r.json())["OUTPUT0"] == [2, 3, 4, 5]
    assert r.json()["model_name"] == "hash1"  # served under the name it was loaded as
    r = c.post("/models/echo/invoke", json=text_request("mme"))
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == ["MME"]
    # the loaded models are ordinary models of the server
    assert httpx.get(f"http://{k.url}/v2/models/echo.tar.gz/ready").status_code == 200
    # and listed in the repository index, as tritonserver lists them (it registers their folders as repositories)
    assert httpx.post(f"http://{k.url}/v2/repository/index").json() == [
        {"name": "echo.tar.gz", "version": "1", "state": "READY"}, {"name": "hash1", "version": "1", "state": "READY"}]

    # loading the same name twice: 409
    registered = {"error": f"model repository '{store / 'hash1'}' has already been registered"}
    r = c.post("/models", json={"model_name": "hash1", "url": str(add_sub_url)})
    assert (r.status_code, r.json()) == (409, registered)
    r = c.post("/models", json={"model_name": "other", "url": f"{add_sub_url}/"})  # the same repository
    assert (r.status_code, r.json()) == (409, registered)
    r = c.post("/models", json={"model_name": "hash1", "url": str(echo_repo) + "/"})
    assert r.status_code == 409 and "already loaded" in r.json()["error"]
    # invoke errors: model errors are 400, out of memory 507, unknown model 404
    r = c.post("/models/echo/invoke", json=text_request("error"))
    assert r.status_code == 400 and "asked to fail" in r.json()["error"]
    assert c.post("/models/echo/invoke", json=text_request("oom")).status_code == 507
    assert c.post("/models/echo/invoke", content=b"{bad").status_code == 400
    r = c.post("/models/unknown/invoke", json=ADD_SUB_JSON)
    assert r.status_code == 404

    # unload, then it is gone; unload again: 404
    assert c.delete("/models/hash1").status_code == 200
    assert c.get("/models/hash1").status_code == 404
    assert c.post("/models/hash1/invoke", json=ADD_SUB_JSON).status_code == 404
    assert httpx.get(f"http://{k.url}/v2/models/hash1/ready").status_code == 400
    assert c.delete("/models/hash1").status_code == 404
    assert [m["modelName"] for m in c.get("/models").json()["models"]] == ["echo"]
    assert [m["name"] for m in httpx.post(f"http://{k.url}/v2/repository/index").json()] == ["echo.tar.gz"]
    # and it can be loaded again
    assert c.post("/models", json={"model_name": "hash1", "url": str(add_sub_url)}).status_code == 200
    assert c.post("/models/hash1/invoke", json=ADD_SUB_JSON).status_code == 200
    assert c.get("/ping").status_code == 200
    assert "successfully unloaded 'hash1' version 1" in k.log()


def test_multi_model_bad_loads(start_kernel, tmp_path):
    empty = tmp_path / "empty_repo"
    empty.mkdir()
    not_a_repo = tmp_path / "not_a_repo"
    (not_a_repo / "docs").mkdir(parents=True)
    broken = copy_model(BAD / "init_fails", tmp_path / "broken")
    oom = write_oom_model(tmp_path / "oom" / "model")
    _, c = sagemaker(start_kernel, [empty], env={"SAGEMAKER_MULTI_MODEL": "true"})

    cases = [
        ({"model_name": "a", "url": str(tmp_path / "does_not_exist")}, 400,
         f"failed to register '{tmp_path / 'does_not_exist'}', repository not found"),
        ({"model_name": "b", "url": str(not_a_repo)}, 400, "neither a model directory nor a repository"),
        ({"model_name": "c", "url": str(broken)}, 400, "failed to load 'c'"),
        ({"model_name": "d", "url": str(oom)}, 507, "out of memory"),
        ({"model_name": "e", "url": "/proc/self"}, 400, "/proc/"),
        ({"model_name": "f"}, 400, "'url'"),
        ({"url": str(broken)}, 400, "'model_name'"),
    ]
    for doc, status, message in cases:
        r = c.post("/models", json=doc)
        assert r.status_code == status, (doc, r.text)
        assert message in r.json()["error"], (doc, r.text)
    r = c.post("/models", content=b"{not json")
    assert r.status_code == 400 and "failed to parse" in r.json()["error"]
    # nothing half-loaded is left behind, and the endpoint keeps serving
    assert c.get("/models").json() == {"models": []}
    assert c.get("/ping").status_code == 200
    good = copy_model(EXAMPLES / "add_sub", tmp_path / "good", "model")
    assert c.post("/models", json={"model_name": "c", "url": str(good)}).status_code == 200
    assert c.post("/models/c/invoke", json=ADD_SUB_JSON).status_code == 200


def test_multi_model_routes_without_multi_model_mode(start_kernel, tmp_path):
    """tritonserver 2.51 serves /models without SAGEMAKER_MULTI_MODEL (measured: GET /models is
    200 {"models": []}, and a load works); the modelUrl is the url exactly as given; it logs
    'Loading SageMaker TargetModel: <name>'; unknown names are a 404 with an empty body."""
    repo = repo_with(tmp_path, CLOUD / "text_echo")
    store = tmp_path / "store"
    copy_model(EXAMPLES / "add_sub", store)  # a repository holding one model folder
    k, c = sagemaker(start_kernel, [repo])
    assert c.get("/models").json() == {"models": []}
    url = f"{store}/"  # trailing slash and all
    r = c.post("/models", json={"model_name": "mm1", "url": url}, headers={"X-Amzn-SageMaker-Target-Model": "t.tar.gz"})
    assert r.status_code == 200, r.text
    assert c.get("/models").json() == {"models": [{"modelName": "mm1", "modelUrl": url}]}
    assert c.get("/models/mm1").json() == {"modelName": "mm1", "modelUrl": url}
    assert "Loading SageMaker TargetModel: t.tar.gz" in k.log()
    assert c.post("/models/mm1/invoke", json=ADD_SUB_JSON).status_code == 200
    for r in (c.get("/models/nope"), c.post("/models/nope/invoke", json=ADD_SUB_JSON), c.delete("/models/nope")):
        assert (r.status_code, r.content) == (404, b"")
    assert c.delete("/models/mm1").status_code == 200
    assert c.get("/models").json() == {"models": []}


def test_chunked_invocations_body_is_capped_at_65536_chunks(start_kernel, tmp_path):
    """tritonserver's cap and words; many one-byte chunks must not grow the server without bound."""
    import socket

    repo = repo_with(tmp_path, EXAMPLES / "add_sub")
    k, c = sagemaker(start_kernel, [repo])
    port = int(str(c.base_url).rsplit(":", 1)[1].rstrip("/"))

    def send_chunks(count: int, split: int = 0) -> bytes:
        """count chunks; the last `split` of them two bytes each, sent in two reads (header and
        first byte, a pause, the rest): a chunk the server reads in pieces is still one chunk."""
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n")
            body = json.dumps(ADD_SUB_JSON).encode()
            # one byte per chunk otherwise: a chunk's data can never be split across two reads
            pieces = [body[i:i + 1] for i in range(len(body))] + [b" "] * (count - len(body) - split)
            try:
                for i in range(0, len(pieces), 4096):
                    s.sendall(b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces[i:i + 4096]))
                for _ in range(split):
                    s.sendall(b"2\r\n ")
                    time.sleep(0.1)
                    s.sendall(b" \r\n")
                s.sendall(b"0\r\n\r\n")
            except OSError:  # the server answered and closed while we were still sending
                pass
            data = b""
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                more = s.recv(65536)
                if not more:
                    break
                data += more
            return data

    ok = send_chunks(65536)
    assert ok.startswith(b"HTTP/1.1 200"), ok[:300]
    ok = send_chunks(65536, split=3)  # exactly the maximum, some chunks read in two pieces
    assert ok.startswith(b"HTTP/1.1 200"), ok[:300]
    refused = send_chunks(65537)
    assert refused.startswith(b"HTTP/1.1 400"), refused[:300]
    assert refused.endswith(b'{"error":"Chunked request body exceeds maximum of 65536 non-empty chunks. '
                            b'Send fewer or larger HTTP chunks."}'), refused[-300:]
    assert c.post("/invocations", json=ADD_SUB_JSON).status_code == 200


# ---- the serve entry point ------------------------------------------------------------------


class ServeProcess:
    """`python -m kernel.serve.sagemaker` with a SageMaker environment."""

    def __init__(self, tmp_path: Path, env: dict, *args: str):
        self.port = free_port()
        self.log_path = tmp_path / f"serve-{self.port}.log"
        self._log = open(self.log_path, "w+b")
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "AIP_"))}
        full_env.update({"SAGEMAKER_BIND_TO_PORT": str(self.port), **env})
        self.proc = subprocess.Popen([sys.executable, "-m", "kernel.serve.sagemaker", "serve", *args], cwd=ROOT,
                                     stdout=self._log, stderr=subprocess.STDOUT, env=full_env)
        self.client = httpx.Client(base_url=f"http://localhost:{self.port}", timeout=30)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> "ServeProcess":
        wait_until_ok(self, [f"http://localhost:{self.port}/ping"])
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.client.close()
        self._log.close()


@pytest.fixture
def serve(tmp_path):
    started = []

    def start(env, *args):
        p = ServeProcess(tmp_path, env, *args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def test_serve_single_model(serve, tmp_path):
    model_dir = repo_with(tmp_path, EXAMPLES / "add_sub", CLOUD / "text_echo")
    p = serve({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"}, f"--model-dir={model_dir}").wait_ready()
    r = p.client.post("/invocations", json=ADD_SUB_JSON)
    assert r.status_code == 200 and add_sub_outputs(r.json())["OUTPUT1"] == [0, 1, 2, 3]
    log = p.log()
    assert f"Started Sagemaker HTTPService at 0.0.0.0:{p.port}" in log
    assert "HTTPService at" not in log.replace("Sagemaker HTTPService", "")  # --allow-http=false
    assert "text_echo" not in log  # only the named model is loaded


def test_serve_only_model_gets_the_warning(serve, tmp_path):
    model_dir = repo_with(tmp_path, CLOUD / "text_echo")
    p = serve({}, f"--model-dir={model_dir}").wait_ready()
    assert "WARNING: No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided" in p.log()
    assert p.client.post("/invocations", json=text_request("w")).json()["outputs"][0]["data"] == ["W"]


@pytest.mark.parametrize(
    "setup, env, message",
    [
        ("two", {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "incorrect_model_name"},
         "ERROR: Directory with provided SAGEMAKER_TRITON_DEFAULT_MODEL_NAME incorrect_model_name does not exist"),
        ("two", {}, "ERROR: More than 1 model directory found in model repository"),
        ("empty", {}, "ERROR: No model found in model repository"),
        ("flat", {}, "ERROR: Incorrect directory structure"),
        ("two", {"SAGEMAKER_TRITON_INFERENCE_TYPE": "incorrect_inference_type"},
         "ERROR: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE 'incorrect_inference_type'"),
    ],
)
def test_serve_refuses_bad_set_ups(serve, tmp_path, setup, env, message):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    if setup == "two":
        copy_model(EXAMPLES / "add_sub", model_dir)
        copy_model(CLOUD / "text_echo", model_dir)
    elif setup == "flat":
        for f in (EXAMPLES / "add_sub").iterdir():
            (shutil.copytree if f.is_dir() else shutil.copy)(f, model_dir / f.name)
    p = serve(env, f"--model-dir={model_dir}")
    assert p.proc.wait(60) == 1
    assert message in p.log()


def test_serve_multi_model(serve, tmp_path):
    store = tmp_path / "models"
    url = copy_model(EXAMPLES / "add_sub", store / "abc", "model")
    p = serve({"SAGEMAKER_MULTI_MODEL": "true"}, f"--model-dir={tmp_path / 'mme_repo'}").wait_ready()
    assert 'ping mode: "live"' in p.log()
    assert p.client.post("/models", json={"model_name": "abc", "url": str(url)}).status_code == 200
    assert p.client.post("/models/abc/invoke", json=ADD_SUB_JSON).status_code == 200
    assert p.client.delete("/models/abc").status_code == 200
    assert p.client.get("/ping").status_code == 200


def test_multi_model_unload_lets_in_flight_requests_finish(start_kernel, tmp_path):
    import threading

    empty = tmp_path / "empty_repo"
    empty.mkdir()
    url = tmp_path / "slow" / "model"
    (url / "1").mkdir(parents=True)
    (url / "config.pbtxt").write_text(
        'backend: "python"\ninput [{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] }]\n'
        'output [{ name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] }]\n'
    )
    (url / "1" / "model.py").write_text(
        "import time\n"
        "import triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        print('unload_probe is executing', flush=True)\n"
        "        time.sleep(2)\n"
        "        out = []\n"
        "        for r in requests:\n"
        "            text = pb_utils.get_input_tensor_by_name(r, 'text_input').as_numpy()\n"
        "            out.append(pb_utils.InferenceResponse([pb_utils.Tensor('text_output', text)]))\n"
        "        return out\n"
    )
    k, c = sagemaker(start_kernel, [empty], env={"SAGEMAKER_MULTI_MODEL": "true"})
    assert c.post("/models", json={"model_name": "slow", "url": str(url)}).status_code == 200
    result = {}

    def invoke():
        with httpx.Client(base_url=str(c.base_url), timeout=60) as own:
            result["response"] = own.post("/models/slow/invoke", json=text_request("inflight"))

    t = threading.Thread(target=invoke)
    t.start()
    assert k.wait_for_log("unload_probe is executing", timeout=30)
    assert c.delete("/models/slow").status_code == 200  # waits for the request in flight
    t.join(60)
    assert result["response"].status_code == 200, result["response"].text
    assert result["response"].json()["outputs"][0]["data"] == ["inflight"]
    assert c.post("/models/slow/invoke", json=text_request("late")).status_code == 404
