"""OpenTelemetry tracing (`--trace-config mode=opentelemetry`), checked at a real OTLP/HTTP receiver.

The receiver is a small HTTP server in the test that decodes each export as the protobuf
ExportTraceServiceRequest (opentelemetry-proto). The span layout expected here is what real
tritonserver 2.51 exported for the same requests (its InferRequest / <model> / compute spans,
their events and triton.* attributes, ensemble steps and BLS calls under the caller's model span).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import EXAMPLES, ROOT, TEST_MODELS, KernelProcess, free_port, running

ENSEMBLES = TEST_MODELS / "scheduling" / "ensembles"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"
HTTP_EVENTS = ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_EVENTS = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
               "GRPC_SEND_END"]
MODEL_EVENTS = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE_EVENTS = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


class Receiver:
    """An OTLP/HTTP trace receiver: every span it was sent, decoded."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[dict] = []
        self.posts: list[dict] = []
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                msg = ExportTraceServiceRequest()
                msg.ParseFromString(body)
                receiver._add(self.path, self.headers, msg)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _add(self, path, headers, msg) -> None:
        with self._cond:
            self.posts.append({"path": path, "content-type": headers.get("content-type")})
            for rs in msg.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append({
                            "name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                            "parent": s.parent_span_id.hex(), "kind": s.kind, "trace_state": s.trace_state,
                            "attributes": {a.key: _value(a.value) for a in s.attributes},
                            "events": [(e.name, e.time_unix_nano) for e in s.events],
                            "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                            "scope": ss.scope.name, "resource": resource,
                        })
            self._cond.notify_all()

    def wait(self, predicate, timeout: float = 15.0) -> list[dict]:
        """Spans once `predicate(spans)` holds (fails the test when it never does)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.spans):
                left = deadline - time.monotonic()
                assert left > 0, f"spans never matched; got {[(s['name'], s['trace_id']) for s in self.spans]}"
                self._cond.wait(left)
            return list(self.spans)

    def trace(self, trace_id: str, count: int) -> list[dict]:
        return [s for s in self.wait(lambda spans: sum(s["trace_id"] == trace_id for s in spans) >= count)
                if s["trace_id"] == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def make_repo(base):
    repo = base / "repo"
    repo.mkdir()
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    shutil.copytree(TEST_MODELS / "tracing" / "bls_traced", repo / "bls_traced")
    for name in ("ens_pipeline", "ens_addsub", "ens_mul"):
        shutil.copytree(ENSEMBLES / name, repo / name)
    return repo


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def kernel(tmp_path_factory, receiver):
    base = tmp_path_factory.mktemp("otel")
    yield from running(KernelProcess(
        [make_repo(base)], "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=1", "--trace-config", f"opentelemetry,url={receiver.url}",
        "--trace-config", "opentelemetry,resource=deployment.environment=test",
        "--trace-config", "opentelemetry,resource=service.name=kernel-under-test",
        "--trace-config", "opentelemetry,bsp_schedule_delay=50",
    ))


def _inputs(module, names=("INPUT0", "INPUT1")):
    out = []
    for n in names:
        t = module.InferInput(n, [4], "FP32")
        t.set_data_from_numpy(np.arange(4, dtype=np.float32))
        out.append(t)
    return out


def _one(spans, name):
    found = [s for s in spans if s["name"] == name]
    assert len(found) == 1, f"{name}: {len(found)} spans in {[s['name'] for s in spans]}"
    return found[0]


def _names(span):
    return [n for n, _ in span["events"]]


def test_http_request_with_traceparent_becomes_its_child(kernel, receiver):
    client = httpclient.InferenceServerClient(kernel.url)
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01", "tracestate": "congo=t61rcWkgMzE"}
    client.infer("add_sub", _inputs(httpclient), headers=headers, request_id="req-1")
    spans = receiver.trace(TRACE_ID, 3)
    top, model, compute = _one(spans, "InferRequest"), _one(spans, "add_sub"), _one(spans, "compute")
    assert top["parent"] == PARENT_SPAN
    assert model["parent"] == top["span_id"] and compute["parent"] == model["span_id"]
    assert _names(top) == HTTP_EVENTS
    assert _names(model) == MODEL_EVENTS
    assert _names(compute) == COMPUTE_EVENTS
    assert model["attributes"] == {
        "triton.model_name": "add_sub", "triton.model_version": 1, "triton.trace_id": model["attributes"]["triton.trace_id"],
        "triton.trace_parent_id": 0, "triton.request_id": "req-1",
    }
    assert top["attributes"] == {} and compute["attributes"] == {}
    assert {s["trace_state"] for s in spans} == {"congo=t61rcWkgMzE"}
    assert {s["kind"] for s in spans} == {2}  # SPAN_KIND_SERVER
    assert {s["scope"] for s in spans} == {"triton-server"}
    resource = top["resource"]
    assert resource["service.name"] == "kernel-under-test" and resource["deployment.environment"] == "test"
    # The model span runs from REQUEST_START to REQUEST_END, compute from COMPUTE_START to COMPUTE_END,
    # all within the request span, in wall-clock time.
    assert model["start"] == model["events"][0][1] and model["end"] == model["events"][-1][1]
    assert compute["start"] == compute["events"][0][1] and compute["end"] == compute["events"][-1][1]
    assert top["start"] <= model["start"] <= compute["start"] <= compute["end"] <= model["end"] <= top["end"]
    assert abs(top["start"] / 1e9 - time.time()) < 60
    assert receiver.posts[0]["path"] == "/v1/traces"
    assert receiver.posts[0]["content-type"] == "application/x-protobuf"


def test_grpc_metadata_traceparent_and_untraced_ids(kernel, receiver):
    trace_id = "1af7651916cd43dd8448eb211c80319c"
    client = grpcclient.InferenceServerClient(kernel.grpc_url)
    client.infer("add_sub", _inputs(grpcclient), headers={"traceparent": f"00-{trace_id}-c7ad6b7169203331-01"})
    spans = receiver.trace(trace_id, 3)
    top = _one(spans, "InferRequest")
    assert top["parent"] == "c7ad6b7169203331"
    assert _names(top) == GRPC_EVENTS
    assert _one(spans, "add_sub")["attributes"]["triton.model_name"] == "add_sub"
    # A request without a traceparent starts a trace of its own (rate 1 samples it).
    before = {s["trace_id"] for s in receiver.spans}
    client.infer("add_sub", _inputs(grpcclient))
    new = receiver.wait(lambda spans: len({s["trace_id"] for s in spans} - before) >= 1)
    fresh = [s for s in new if s["trace_id"] not in before]
    assert _one(fresh, "InferRequest")["parent"] == ""


def test_ensemble_steps_and_bls_calls_are_children_across_the_worker(kernel, receiver):
    trace_id = "2af7651916cd43dd8448eb211c80319c"
    client = httpclient.InferenceServerClient(kernel.url)
    result = client.infer("bls_traced", _inputs(httpclient), headers={"traceparent": f"00-{trace_id}-{PARENT_SPAN}-01"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32) * 2)
    # InferRequest, bls_traced + compute, add_sub + compute, ens_pipeline, ens_addsub + compute, ens_mul + compute
    spans = receiver.trace(trace_id, 10)
    assert sorted(s["name"] for s in spans) == sorted([
        "InferRequest", "bls_traced", "compute", "add_sub", "compute", "ens_pipeline", "ens_addsub", "compute",
        "ens_mul", "compute"])
    caller = _one(spans, "bls_traced")
    # What the model saw as request.trace().get_context(): its own model span, as W3C JSON.
    context = json.loads(result.as_numpy("CONTEXT")[0])
    assert context == {"traceparent": f"00-{trace_id}-{caller['span_id']}-01"}
    add_sub, ensemble = _one(spans, "add_sub"), _one(spans, "ens_pipeline")
    assert add_sub["parent"] == caller["span_id"] and ensemble["parent"] == caller["span_id"]
    caller_id = caller["attributes"]["triton.trace_id"]
    assert add_sub["attributes"]["triton.trace_parent_id"] == caller_id
    assert ensemble["attributes"]["triton.trace_parent_id"] == caller_id
    for step in ("ens_addsub", "ens_mul"):
        s = _one(spans, step)
        assert s["parent"] == ensemble["span_id"]
        assert s["attributes"]["triton.trace_parent_id"] == ensemble["attributes"]["triton.trace_id"]
        assert _names(s) == MODEL_EVENTS
    assert _names(ensemble) == MODEL_EVENTS
    computes = [s for s in spans if s["name"] == "compute"]
    by_id = {s["span_id"]: s["name"] for s in spans}
    assert sorted(by_id[c["parent"]] for c in computes) == ["add_sub", "bls_traced", "ens_addsub", "ens_mul"]


# ---- the OpenAI routes and the generate extension ----------------------------------------------------


@pytest.fixture(scope="module")
def generative(tmp_path_factory, receiver):
    """tiny_lm and the embed model, with the OpenAI API on a port of its own."""
    base = tmp_path_factory.mktemp("otel-generative")
    repo = base / "repo"
    repo.mkdir()
    shutil.copytree(EXAMPLES / "tiny_lm", repo / "tiny_lm")
    shutil.copytree(TEST_MODELS / "openai" / "embed", repo / "embed")
    port = free_port()
    k = KernelProcess([repo], "--openai-port", str(port), "--trace-config", "mode=opentelemetry",
                      "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                      "--trace-config", f"opentelemetry,url={receiver.url}",
                      "--trace-config", "opentelemetry,bsp_schedule_delay=50")
    k.openai_port = port
    yield from running(k)


def _post(url: str, body: dict, trace_id: str) -> bytes:
    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST", headers={
        "content-type": "application/json", "traceparent": f"00-{trace_id}-{PARENT_SPAN}-01"})
    with urllib.request.urlopen(request, timeout=60) as r:
        assert r.status == 200
        return r.read()


def _call_spans(receiver, trace_id: str, model: str, requests: int) -> list[dict]:
    """The spans of one traced call: InferRequest under the caller's span, one model span per model
    request under it, and each model span's compute span; HTTP events as an infer request has."""
    spans = receiver.trace(trace_id, 1 + 2 * requests)
    top = _one(spans, "InferRequest")
    assert top["parent"] == PARENT_SPAN and _names(top) == HTTP_EVENTS
    models = [s for s in spans if s["name"] == model]
    assert len(models) == requests and {m["parent"] for m in models} == {top["span_id"]}
    for m in models:
        assert _names(m) == MODEL_EVENTS and m["attributes"]["triton.model_name"] == model
        # (a decoupled model's work may end after its final response was written: no bound on the end)
        assert top["start"] <= m["start"] <= top["end"] and m["start"] <= m["end"]
    computes = [s for s in spans if s["name"] == "compute"]
    assert sorted(c["parent"] for c in computes) == sorted(m["span_id"] for m in models)
    return spans


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_with_traceparent_is_traced_as_infer_is(generative, receiver, stream):
    trace_id = "5af7651916cd43dd8448eb211c8031" + ("5d" if stream else "5c")
    body = {"model": "tiny_lm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 2,
            "stream": stream}
    answer = _post(f"http://localhost:{generative.openai_port}/v1/chat/completions", body, trace_id)
    assert (b"[DONE]" in answer) if stream else (len(json.loads(answer)["choices"]) == 2)
    _call_spans(receiver, trace_id, "tiny_lm", 2)


def test_openai_completions_and_embeddings_are_traced(generative, receiver):
    base = f"http://localhost:{generative.openai_port}/v1"
    _post(f"{base}/completions", {"model": "tiny_lm", "prompt": "the cat", "max_tokens": 2}, "6af7651916cd43dd8448eb211c80316c")
    _call_spans(receiver, "6af7651916cd43dd8448eb211c80316c", "tiny_lm", 1)
    _post(f"{base}/embeddings", {"model": "embed", "input": ["a b", "c"]}, "6af7651916cd43dd8448eb211c80316d")
    _call_spans(receiver, "6af7651916cd43dd8448eb211c80316d", "embed", 2)


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_kserve_generate_routes_are_traced(generative, receiver, route):
    trace_id = "7af7651916cd43dd8448eb211c8031" + ("7a" if route == "generate" else "7b")
    answer = _post(f"http://{generative.url}/v2/models/tiny_lm/{route}",
                   {"text_input": "the cat", "max_tokens": 2, "stream": route == "generate_stream"}, trace_id)
    assert b"text_output" in answer
    _call_spans(receiver, trace_id, "tiny_lm", 1)


def test_settings_api_in_opentelemetry_mode(kernel):
    def raw(path, body=None):
        req = urllib.request.Request(f"http://{kernel.url}{path}", data=body, method="POST" if body else "GET")
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    status, text = raw("/v2/trace/setting")
    assert status == 200
    # tritonserver 2.51's answer for these flags, byte for byte: the resource setting given twice appears twice.
    url = json.loads(text)["url"]
    assert text == (
        '{"trace_level":["TIMESTAMPS"],"trace_rate":"1","trace_count":"-1","trace_mode":"opentelemetry",'
        f'"url":"{url}","resource":"deployment.environment=test","resource":"service.name=kernel-under-test",'
        '"bsp_schedule_delay":"50","bsp_max_export_batch_size":"512","bsp_max_queue_size":"2048"}'
    )
    # Rate, level and count change at run time; the exporter's settings and the mode do not
    # (accepted and ignored, as tritonserver does); the trace file is refused.
    status, text = raw("/v2/models/add_sub/trace/setting", b'{"trace_rate":"3","url":"http://elsewhere","trace_mode":"triton","log_frequency":"2"}')
    doc = json.loads(text)
    assert status == 200 and doc["trace_rate"] == "3" and doc["url"] == url and doc["trace_mode"] == "opentelemetry"
    assert "log_frequency" not in doc and "trace_file" not in doc
    status, text = raw("/v2/trace/setting", b'{"trace_file":"/tmp/x"}')
    assert status == 501 and "trace file location can not be updated through network protocol" in text
    client = grpcclient.InferenceServerClient(kernel.grpc_url)
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["resource"]["value"] == ["deployment.environment=test", "service.name=kernel-under-test"]
    assert settings["trace_mode"]["value"] == ["opentelemetry"]
    status, text = raw("/v2/models/add_sub/trace/setting", b'{"trace_rate":null}')
    assert json.loads(text)["trace_rate"] == "1"


def test_rate_zero_traces_only_propagated_requests(start_kernel, tmp_path):
    r = Receiver()
    try:
        k = start_kernel([EXAMPLES], "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
                         "--trace-config", "rate=0", "--trace-config", f"opentelemetry,url={r.url}",
                         "--trace-config", "opentelemetry,bsp_schedule_delay=50").wait_ready()
        client = httpclient.InferenceServerClient(k.url)
        for _ in range(3):
            client.infer("add_sub", _inputs(httpclient))
        trace_id = "3af7651916cd43dd8448eb211c80319c"
        client.infer("add_sub", _inputs(httpclient), headers={"traceparent": f"00-{trace_id}-{PARENT_SPAN}-01"})
        # A malformed traceparent is no context: not traced at rate 0.
        client.infer("add_sub", _inputs(httpclient), headers={"traceparent": "00-zz-yy-01"})
        r.trace(trace_id, 3)
        assert k.stop() == 0  # the exporter flushes at shutdown: nothing else was traced
        assert {s["trace_id"] for s in r.spans} == {trace_id}
    finally:
        r.close()


def test_spans_left_are_exported_at_shutdown(start_kernel):
    r = Receiver()
    try:
        k = start_kernel([EXAMPLES], "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
                         "--trace-config", "rate=2", "--trace-config", f"opentelemetry,url={r.url}").wait_ready()
        client = grpcclient.InferenceServerClient(k.grpc_url)
        for _ in range(4):
            client.infer("add_sub", _inputs(grpcclient))
        assert k.stop() == 0  # long before the default 5 s schedule delay
        assert sorted(s["name"] for s in r.spans) == sorted(["InferRequest", "add_sub", "compute"] * 2)
    finally:
        r.close()


def test_sigterm_with_the_collector_down_stops_within_the_exit_timeout(start_kernel):
    """Spans for a collector that is down (a closed local port): SIGTERM took 25-31 s with
    --exit-timeout-secs 10 (the SDK's shutdown waits up to 30 s for its last export, retrying).
    The exit timeout bounds it; the spans left are dropped with a warning."""
    closed = free_port()  # nothing listens there
    k = start_kernel([EXAMPLES], "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
                     "--trace-config", "rate=1", "--trace-config",
                     f"opentelemetry,url=http://127.0.0.1:{closed}/v1/traces", "--exit-timeout-secs=4").wait_ready()
    client = httpclient.InferenceServerClient(k.url)
    for _ in range(400):  # 1200 spans: three export batches, each retried until its own timeout
        client.infer("add_sub", _inputs(httpclient))
    client.close()
    start = time.monotonic()
    k.proc.send_signal(signal.SIGTERM)
    code = k.proc.wait(60)
    took = time.monotonic() - start
    assert took < 4 + 3, f"SIGTERM took {took:.1f} s with --exit-timeout-secs=4"
    assert code == 0
    assert "did not take the last spans" in k.log()


@pytest.mark.parametrize("flags, message", [
    (["--trace-config", "mode=opentelemetry", "--trace-config", "opentelemetry,bsp_max_queue_size=abc"],
     'Bad option: "--trace-config opentelemetry,bsp_max_queue_size".\nInvalid option value. Got abc'),
    (["--trace-config", "mode=zipkin"], 'invalid value for trace mode option: zipkin'),
])
def test_bad_opentelemetry_flags_stop_the_server(start_kernel, flags, message):
    k = start_kernel([EXAMPLES], *flags)
    assert k.wait_exit(60) != 0
    assert message in k.log()


def test_deprecated_file_flags_are_ignored_with_a_warning(start_kernel, tmp_path):
    k = start_kernel([EXAMPLES], "--trace-config", "mode=opentelemetry", "--trace-file", str(tmp_path / "t.json"),
                     "--trace-log-frequency", "5").wait_ready()
    assert "'--trace-file' is deprecated and will be ignored with opentelemetry tracing mode." in k.log()
    assert "'--trace-log-frequency' is deprecated and will be ignored with opentelemetry tracing mode." in k.log()
    with urllib.request.urlopen(f"http://{k.url}/v2/trace/setting") as resp:
        doc = json.loads(resp.read())
    assert doc["trace_mode"] == "opentelemetry" and "trace_file" not in doc


def test_nothing_of_opentelemetry_or_redis_is_loaded_when_off(tmp_path):
    """A server built from the default flags has not imported OpenTelemetry (nor the Redis client)."""
    code = (
        "import sys\n"
        "from kernel.serve import cli\n"
        f"args = cli.build_parser().parse_args(['serve', '--model-repository', {str(EXAMPLES)!r}, '--http-port', '18991',"
        " '--grpc-port', '18992', '--metrics-port', '18993'])\n"
        "server = cli.build_server(args)\n"
        "assert server.tracer.otel is None\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'redis')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_help_lists_opentelemetry_and_redis_as_supported():
    out = subprocess.run([sys.executable, "-m", "kernel", "serve", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    text = " ".join(out.stdout.split())
    for flag in ("--trace-config", "--cache-config"):
        start = text.index(flag + " ")
        entry = text[start:start + 400]
        assert "not supported" not in entry and "refused" not in entry, entry
    assert "mode (triton or opentelemetry)" in text and "redis,host=<host>" in text


def test_pytriton_trace_and_cache_config(tmp_path):
    """TritonConfig(trace_config=[...mode=opentelemetry...], cache_config=[redis,...]) as PyTriton users write
    them: a bound callable's requests export spans, and its responses land in the shared Redis."""
    from conftest import free_ports
    from kernel.decorators import batch
    from kernel.model_config import ModelConfig, Tensor
    from kernel.triton import Triton, TritonConfig
    from redis_server import RedisServer

    calls = []

    @batch
    def double(x):
        calls.append(len(x))
        return {"y": x * 2}

    r = Receiver()
    redis = RedisServer(tmp_path / "redis")
    try:
        http, grpc, metrics = free_ports(3)
        config = TritonConfig(
            http_port=http, grpc_port=grpc, metrics_port=metrics,
            trace_config=["mode=opentelemetry", "level=TIMESTAMPS", "rate=1", f"opentelemetry,url={r.url}",
                          "opentelemetry,bsp_schedule_delay=50"],
            cache_config=["redis,host=127.0.0.1", f"redis,port={redis.port}"],
        )
        spec = dict(inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                    outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))])
        trace_id = "4af7651916cd43dd8448eb211c80319c"
        with Triton(config=config, workspace=tmp_path / "ws") as triton:
            triton.bind("doubler", double, config=ModelConfig(response_cache=True), **spec)
            triton.run()
            c = httpclient.InferenceServerClient(f"localhost:{http}")
            for _ in range(2):
                t = httpclient.InferInput("x", [1, 3], "FP32")
                t.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.float32))
                out = c.infer("doubler", [t], headers={"traceparent": f"00-{trace_id}-{PARENT_SPAN}-01"})
                np.testing.assert_array_equal(out.as_numpy("y"), [[2, 4, 6]])
                time.sleep(0.3)  # the first response's insert is not awaited by the request
            spans = r.wait(lambda spans: sum(s["name"] == "doubler" for s in spans) >= 2)
            c.close()
        assert _one([s for s in spans if s["name"] == "InferRequest"][:1], "InferRequest")["parent"] == PARENT_SPAN
        assert len(calls) == 1  # the second request was a hit
        assert any(k.startswith("kernel:response-cache:") for k in redis.command("KEYS", "*").split())
    finally:
        redis.kill()
        r.close()
