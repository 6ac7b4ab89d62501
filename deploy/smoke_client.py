"""The client half of deploy/smoke-test.sh. It needs only what the image itself has (Kernel's runtime:
numpy, tritonclient), so smoke-test.sh runs it inside the image (`podman run --network=host IMAGE
python smoke_client.py ...`), on a machine where nothing else was installed (no `make serve` venv).

    smoke_client.py wait URL [TIMEOUT]                 poll until URL answers 200; print the seconds taken
    smoke_client.py kserve HTTP_PORT GRPC_PORT METRICS_PORT   add_sub over HTTP and gRPC, metadata, metrics
    smoke_client.py openai PORT                        a streamed chat (tiny_lm) and a chat template (echo_chat)
    smoke_client.py drain HTTP_PORT                    a slow request in flight; prints "in flight", the
                                                       caller sends SIGTERM; readiness must drop, the request finish
    smoke_client.py sagemaker PORT                     /ping and /invocations on add_sub
    smoke_client.py vertex PORT HEALTH PREDICT         AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE on add_sub
Each check prints one line; any failure raises (exit status 1).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np

ADD_SUB = {
    "inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]},
    ]
}
EXPECTED = {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post_json(url: str, body: dict, timeout: float = 30.0) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {"error": e.read().decode(errors="replace")}


def wait(url: str, timeout: float = 120.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if get(url, timeout=2)[0] == 200:
                took = time.monotonic() - start
                print(f"ready: {url} answered 200 after {took:.2f} s of polling")
                return took
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} not ready after {timeout} s")


def check_outputs(outputs: dict, how: str) -> None:
    got = {k: [float(x) for x in np.asarray(v).ravel()] for k, v in outputs.items()}
    assert got == EXPECTED, f"{how}: {got}"
    print(f"{how}: add_sub OUTPUT0={got['OUTPUT0']} OUTPUT1={got['OUTPUT1']}")


def kserve(http_port: str, grpc_port: str, metrics_port: str) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.ones(4, dtype=np.float32)

    h = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    assert h.is_server_ready() and h.is_model_ready("add_sub")
    meta = h.get_server_metadata()
    print(f"HTTP GET /v2: name={meta['name']} version={meta['version']}")
    ins = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    r = h.infer("add_sub", ins)
    check_outputs({n: r.as_numpy(n) for n in ("OUTPUT0", "OUTPUT1")}, "tritonclient.http")

    g = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    assert g.is_server_ready() and g.is_model_ready("add_sub")
    ins = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    r = g.infer("add_sub", ins)
    check_outputs({n: r.as_numpy(n) for n in ("OUTPUT0", "OUTPUT1")}, "tritonclient.grpc")
    models = sorted(m.name for m in g.get_model_repository_index().models)
    print(f"gRPC repository index: {models}")

    status, text = get(f"http://127.0.0.1:{metrics_port}/metrics")
    lines = [ln for ln in text.decode().splitlines() if ln.startswith("nv_inference_request_success{")]
    assert status == 200 and any('model="add_sub"' in ln for ln in lines), text[:500]
    print(f"metrics :{metrics_port}: " + "; ".join(ln for ln in lines if 'model="add_sub"' in ln))


def drain(http_port: str) -> None:
    """A request to model `slow` (sleeps 3 s) is in flight when the caller sends SIGTERM (on seeing
    "in flight"): it must finish with 200, and /v2/health/ready must stop answering 200 meanwhile."""
    base = f"http://127.0.0.1:{http_port}"
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [7]}]}
    result: dict = {}

    def in_flight() -> None:
        start = time.monotonic()
        try:
            result["status"], result["body"] = post_json(f"{base}/v2/models/slow/infer", body)
        except Exception as e:  # noqa: BLE001
            result["status"], result["body"] = None, repr(e)
        result["took"] = time.monotonic() - start

    t = threading.Thread(target=in_flight)
    t.start()
    time.sleep(1.0)
    print("in flight: a 3 s request to model slow; send SIGTERM now", flush=True)
    marked = time.monotonic()
    ready = 200
    while ready == 200 and time.monotonic() - marked < 10:  # the caller's signal takes a moment to come
        time.sleep(0.05)
        try:
            ready = get(f"{base}/v2/health/ready", timeout=2)[0]
        except (urllib.error.URLError, OSError) as e:
            ready = f"connection failed ({getattr(e, 'reason', e)})"
    print(f"/v2/health/ready {time.monotonic() - marked:.2f} s after 'in flight': {ready}")
    assert ready != 200, "still ready 10 s after asking for SIGTERM"
    t.join(30)
    print(f"in-flight request: status {result.get('status')}, took {result.get('took', 0):.2f} s")
    assert result.get("status") == 200, result
    assert result["body"]["outputs"][0]["data"] == [7], result


def chat_stream(port: str, model: str, messages: list, **extra) -> tuple[str, list]:
    """POST /v1/chat/completions with stream=true, read as server-sent events: (text, finish reasons)."""
    body = {"model": model, "messages": messages, "stream": True, **extra}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    text, reasons, done = [], [], False
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream"), r.headers
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            for choice in chunk["choices"]:
                text.append(choice["delta"].get("content") or "")
                if choice.get("finish_reason"):
                    reasons.append(choice["finish_reason"])
    assert done, "the stream did not end with data: [DONE]"
    return "".join(text), reasons


def openai(port: str) -> None:
    status, body = get(f"http://127.0.0.1:{port}/v1/models")
    models = sorted(m["id"] for m in json.loads(body)["data"])
    assert status == 200 and "tiny_lm" in models, (status, body[:300])
    text, reasons = chat_stream(port, "tiny_lm", [{"role": "user", "content": "Tell me about the river."}],
                                max_tokens=12, seed=1)
    assert text.strip() and reasons, (text, reasons)
    print(f"OpenAI :{port} streamed chat (tiny_lm): {text.strip()!r}, finish_reason {reasons[-1]}")
    # echo_chat answers with its prompt: its chat_template.jinja rendered (jinja2 in the image)
    text, _ = chat_stream(port, "echo_chat", [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Hello"}])
    assert text == "[system] Be brief. [user] Hello [assistant]", text
    print(f"OpenAI :{port} chat template (echo_chat): {text!r}")


def sagemaker(port: str) -> None:
    status, _ = get(f"http://127.0.0.1:{port}/ping")
    assert status == 200, status
    status, body = post_json(f"http://127.0.0.1:{port}/invocations", ADD_SUB)
    assert status == 200, body
    check_outputs({o["name"]: o["data"] for o in body["outputs"]}, "SageMaker POST /invocations")


def vertex(port: str, health: str, predict: str) -> None:
    status, _ = get(f"http://127.0.0.1:{port}{health}")
    assert status == 200, status
    status, body = post_json(f"http://127.0.0.1:{port}{predict}", ADD_SUB)
    assert status == 200, body
    check_outputs({o["name"]: o["data"] for o in body["outputs"]}, f"Vertex AI POST {predict}")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "wait":
        wait(args[0], float(args[1]) if len(args) > 1 else 120.0)
    else:
        {"kserve": kserve, "openai": openai, "drain": drain, "sagemaker": sagemaker, "vertex": vertex}[cmd](*args)
