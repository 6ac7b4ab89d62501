"""The response cache (`--cache-config local,size=BYTES`, `response_cache { enable: true }`),
against a real `kernel serve`, with what tritonserver 2.51 was seen to do on the same models:
what is a hit, what the statistics extension and /metrics report, which models are refused,
and the flags' forms. The model returns how many requests it has executed (COUNT), so a hit
is seen by the client: COUNT does not move."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, TEST_MODELS, KernelProcess, running

REPO = TEST_MODELS / "cache"
SERVE = ["--exit-on-error=false", "--strict-readiness=false"]


@pytest.fixture(scope="module")
def kernel():
    yield from running(KernelProcess([REPO], "--cache-config", "local,size=1048576", *SERVE))


def infer(client, model, a, b, outputs=None, **kwargs):
    i0 = httpclient.InferInput("INPUT0", [4], "FP32")
    i0.set_data_from_numpy(np.asarray(a, dtype=np.float32))
    i1 = httpclient.InferInput("INPUT1", [4], "FP32")
    i1.set_data_from_numpy(np.asarray(b, dtype=np.float32))
    outs = [httpclient.InferRequestedOutput(n) for n in outputs] if outputs else None
    return client.infer(model, [i0, i1], outputs=outs, **kwargs)


def count(result) -> int:
    return int(result.as_numpy("COUNT")[0])


def stats(k, model):
    with urllib.request.urlopen(f"http://{k.url}/v2/models/{model}/stats") as r:
        return json.loads(r.read())["model_stats"][0]


def metrics(k) -> str:
    with urllib.request.urlopen(f"http://localhost:{k.metrics_port}/metrics") as r:
        return r.read().decode()


def metric(text: str, name: str, model: str | None = None) -> float:
    labels = r'\{model="%s",version="1"\}' % model if model else ""
    m = re.search(rf"^{name}{labels} (\S+)$", text, re.M)
    assert m, f"{name} {model or ''} not in /metrics"
    return float(m.group(1))


def test_a_hit_skips_the_model_and_the_key_is_the_inputs(kernel):
    c = httpclient.InferenceServerClient(kernel.url)
    first = infer(c, "cached_add_sub", [1, 2, 3, 4], [1, 1, 1, 1])
    executed = count(first)
    again = infer(c, "cached_add_sub", [1, 2, 3, 4], [1, 1, 1, 1])
    assert count(again) == executed
    np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), [2, 3, 4, 5])
    np.testing.assert_array_equal(again.as_numpy("OUTPUT1"), [0, 1, 2, 3])
    # Another input value is another key: the model runs.
    other = infer(c, "cached_add_sub", [1, 2, 3, 4], [1, 1, 1, 2])
    assert count(other) == executed + 1
    np.testing.assert_array_equal(other.as_numpy("OUTPUT0"), [2, 3, 4, 6])
    # The request id is not part of the key (as in Triton); the id is still echoed. Request
    # parameters are (unlike Triton 2.51: they reach the model; tests/core/test_cache_key.py).
    with_id = infer(c, "cached_add_sub", [1, 2, 3, 4], [1, 1, 1, 1], request_id="abc")
    assert count(with_id) == executed
    assert with_id.get_response()["id"] == "abc"
    assert count(infer(c, "cached_add_sub", [1, 2, 3, 4], [1, 1, 1, 1], parameters={"p": 1})) == executed + 2
    # gRPC reads the same cache.
    g = grpcclient.InferenceServerClient(kernel.grpc_url)
    i0 = grpcclient.InferInput("INPUT0", [4], "FP32")
    i0.set_data_from_numpy(np.array([1, 2, 3, 4], dtype=np.float32))
    i1 = grpcclient.InferInput("INPUT1", [4], "FP32")
    i1.set_data_from_numpy(np.array([1, 1, 1, 1], dtype=np.float32))
    assert int(g.infer("cached_add_sub", [i0, i1]).as_numpy("COUNT")[0]) == executed
    g.close()
    # A model without response_cache runs every time.
    p1 = count(infer(c, "plain_add_sub", [1, 2, 3, 4], [1, 1, 1, 1]))
    assert count(infer(c, "plain_add_sub", [1, 2, 3, 4], [1, 1, 1, 1])) == p1 + 1
    c.close()


def test_a_hit_answers_with_the_requested_outputs(kernel):
    c = httpclient.InferenceServerClient(kernel.url)
    executed = count(infer(c, "cached_add_sub", [5, 5, 5, 5], [1, 2, 3, 4]))
    only = infer(c, "cached_add_sub", [5, 5, 5, 5], [1, 2, 3, 4], outputs=["OUTPUT1"])
    assert [o["name"] for o in only.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), [4, 3, 2, 1])
    # Stored from a request that asked for one output, an entry cannot answer a request for all.
    executed2 = count(infer(c, "cached_add_sub", [6, 6, 6, 6], [1, 2, 3, 4], outputs=["COUNT"]))
    assert executed2 == executed + 1
    full = infer(c, "cached_add_sub", [6, 6, 6, 6], [1, 2, 3, 4])
    assert count(full) == executed2 + 1 and full.as_numpy("OUTPUT0") is not None
    assert count(infer(c, "cached_add_sub", [6, 6, 6, 6], [1, 2, 3, 4])) == executed2 + 1
    c.close()


def test_statistics_and_metrics_count_hits_and_misses(kernel):
    c = httpclient.InferenceServerClient(kernel.url)
    before = stats(kernel, "cached_add_sub")
    for _ in range(3):
        infer(c, "cached_add_sub", [9, 9, 9, 9], [0, 0, 0, 0])
    after = stats(kernel, "cached_add_sub")
    s0, s1 = before["inference_stats"], after["inference_stats"]
    assert s1["cache_miss"]["count"] - s0["cache_miss"]["count"] == 1
    assert s1["cache_hit"]["count"] - s0["cache_hit"]["count"] == 2
    assert s1["cache_hit"]["ns"] > s0["cache_hit"]["ns"] and s1["cache_miss"]["ns"] > s0["cache_miss"]["ns"]
    # As in Triton: hits are successes (and queue entries) but neither inferences, executions nor compute.
    assert s1["success"]["count"] - s0["success"]["count"] == 3
    assert s1["queue"]["count"] - s0["queue"]["count"] == 3
    assert after["inference_count"] - before["inference_count"] == 1
    assert after["execution_count"] - before["execution_count"] == 1
    assert s1["compute_infer"]["count"] - s0["compute_infer"]["count"] == 1
    assert s1["compute_infer"]["count"] == s1["success"]["count"] - s1["cache_hit"]["count"]
    # gRPC ModelStatistics carries the same numbers.
    g = grpcclient.InferenceServerClient(kernel.grpc_url)
    gs = g.get_inference_statistics("cached_add_sub", as_json=True)["model_stats"][0]["inference_stats"]
    assert int(gs["cache_hit"]["count"]) == s1["cache_hit"]["count"]
    g.close()

    text = metrics(kernel)
    assert metric(text, "nv_cache_num_hits_per_model", "cached_add_sub") == s1["cache_hit"]["count"]
    assert metric(text, "nv_cache_num_misses_per_model", "cached_add_sub") == s1["cache_miss"]["count"]
    assert metric(text, "nv_cache_hit_duration_per_model", "cached_add_sub") == s1["cache_hit"]["ns"] // 1000
    assert metric(text, "nv_cache_miss_duration_per_model", "cached_add_sub") == s1["cache_miss"]["ns"] // 1000
    assert "# TYPE nv_cache_num_hits_per_model counter" in text
    assert 'nv_cache_num_hits_per_model{model="plain_add_sub"' not in text
    assert metric(text, "nv_cache_num_entries") >= 1
    assert metric(text, "nv_cache_num_lookups") == metric(text, "nv_cache_num_hits") + metric(text, "nv_cache_num_misses")
    assert 0 < metric(text, "nv_cache_util") < 0.01
    for gauge in ("nv_cache_util", "nv_cache_num_entries", "nv_cache_num_evictions", "nv_cache_lookup_duration",
                  "nv_cache_insertion_duration"):
        assert f"# TYPE {gauge} gauge" in text
    assert metric(text, "nv_inference_count", "cached_add_sub") == after["inference_count"]
    c.close()


def test_decoupled_models_cannot_enable_the_cache(kernel):
    req = urllib.request.Request(f"http://{kernel.url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req) as r:
        index = {m["name"]: m for m in json.loads(r.read())}
    assert index["cached_decoupled"]["state"] == "UNAVAILABLE"
    assert index["cached_decoupled"]["reason"] == (
        "Response Cache does not currently support model cached_decoupled with 'decoupled' transaction policy. "
        "Please disable the response cache.")


def test_least_recently_used_entries_are_evicted_by_size(start_kernel):
    # An entry here costs 212 bytes (128 overhead + 44 key + 40 output bytes): two fit in 500.
    k = start_kernel([REPO], "--cache-config", "local,size=500", *SERVE).wait_ready()
    c = httpclient.InferenceServerClient(k.url)
    a = count(infer(c, "cached_add_sub", [1, 1, 1, 1], [0, 0, 0, 0]))
    b = count(infer(c, "cached_add_sub", [2, 2, 2, 2], [0, 0, 0, 0]))
    assert count(infer(c, "cached_add_sub", [1, 1, 1, 1], [0, 0, 0, 0])) == a  # hit: A is now the newest
    cc = count(infer(c, "cached_add_sub", [3, 3, 3, 3], [0, 0, 0, 0]))  # evicts B, the least recently used
    assert cc == b + 1
    assert count(infer(c, "cached_add_sub", [1, 1, 1, 1], [0, 0, 0, 0])) == a
    assert count(infer(c, "cached_add_sub", [2, 2, 2, 2], [0, 0, 0, 0])) == cc + 1  # B ran again
    text = metrics(k)
    assert metric(text, "nv_cache_num_evictions") == 2
    assert metric(text, "nv_cache_num_entries") == 2
    c.close()


def test_without_a_server_cache_the_model_runs_and_reports_zero(start_kernel):
    k = start_kernel([REPO], "--response-cache-byte-size", "0", *SERVE)
    assert k.wait_exit(30) != 0  # size 0 is refused, as by tritonserver
    k = start_kernel([REPO], *SERVE).wait_ready()
    c = httpclient.InferenceServerClient(k.url)
    n = count(infer(c, "cached_add_sub", [1, 2, 3, 4], [1, 1, 1, 1]))
    assert count(infer(c, "cached_add_sub", [1, 2, 3, 4], [1, 1, 1, 1])) == n + 1
    text = metrics(k)
    assert metric(text, "nv_cache_num_hits_per_model", "cached_add_sub") == 0  # as tritonserver shows it
    assert "nv_cache_util" not in text
    assert stats(k, "cached_add_sub")["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}
    c.close()


def test_deprecated_byte_size_flag_turns_on_the_local_cache(start_kernel):
    k = start_kernel([REPO], "--response-cache-byte-size", "65536", *SERVE).wait_ready()
    c = httpclient.InferenceServerClient(k.url)
    n = count(infer(c, "cached_add_sub", [1, 2, 3, 4], [1, 1, 1, 1]))
    assert count(infer(c, "cached_add_sub", [1, 2, 3, 4], [1, 1, 1, 1])) == n
    assert "'--response-cache-byte-size' has been deprecated!" in k.log()
    assert "'--cache-config=local,size=65536'" in k.log()
    c.close()


@pytest.mark.parametrize("flag, message", [
    ("local", "No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got local"),
    ("memcached,host=localhost", "unable to find cache 'memcached'"),
    ("local,size=abc", "Failed to initialize LocalCache"),
])
def test_bad_cache_config_stops_the_server(flag, message):
    out = subprocess.run([sys.executable, "-m", "kernel", "serve", "--model-repository", str(REPO),
                          "--cache-config", flag], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert message in out.stdout + out.stderr


def test_pytriton_cache_config_and_model_response_cache():
    """PyTriton's spelling: TritonConfig(cache_config=[...]) and ModelConfig(response_cache=True)."""
    import tempfile
    from pathlib import Path

    from conftest import free_ports
    from kernel.decorators import batch
    from kernel.model_config import ModelConfig, Tensor
    from kernel.triton import Triton, TritonConfig

    calls = []

    @batch
    def double(x):
        calls.append(len(x))
        return {"y": x * 2}

    http, grpc, metrics_port = free_ports(3)
    config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics_port,
                          cache_config=["local,size=1048576"])
    spec = dict(inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))])
    with Triton(config=config, workspace=Path(tempfile.mkdtemp()) / "ws") as triton:
        triton.bind("cached", double, config=ModelConfig(response_cache=True), **spec)
        triton.bind("uncached", double, **spec)
        triton.run()
        c = httpclient.InferenceServerClient(f"localhost:{http}")
        for model in ("cached", "uncached", "cached", "uncached", "cached"):
            t = httpclient.InferInput("x", [1, 3], "FP32")
            t.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.float32))
            np.testing.assert_array_equal(c.infer(model, [t]).as_numpy("y"), [[2, 4, 6]])
        with urllib.request.urlopen(f"http://localhost:{http}/v2/models/cached/config") as r:
            assert json.loads(r.read())["response_cache"] == {"enable": True}
        c.close()
    assert len(calls) == 3  # the cached model ran once, the other twice


def test_shared_memory_requests_are_cached_and_hits_fill_the_output_region(kernel):
    """As tritonserver 2.51: inputs read from a system shared-memory region make the same key as
    inline ones, and a hit writes its outputs into the request's output region."""
    import uuid

    import tritonclient.utils.shared_memory as shm

    c = httpclient.InferenceServerClient(kernel.url)
    tag = uuid.uuid4().hex[:8]
    a = np.array([7, 7, 7, 7], dtype=np.float32)
    b = np.array([1, 2, 3, 4], dtype=np.float32)
    h_in = shm.create_shared_memory_region(f"in{tag}", f"/in{tag}", 32)
    h_out = shm.create_shared_memory_region(f"out{tag}", f"/out{tag}", 16)
    try:
        shm.set_shared_memory_region(h_in, [a, b])
        c.register_system_shared_memory(f"in{tag}", f"/in{tag}", 32)
        c.register_system_shared_memory(f"out{tag}", f"/out{tag}", 16)

        def run(to_region: bool):
            i0 = httpclient.InferInput("INPUT0", [4], "FP32")
            i0.set_shared_memory(f"in{tag}", 16, 0)
            i1 = httpclient.InferInput("INPUT1", [4], "FP32")
            i1.set_shared_memory(f"in{tag}", 16, 16)
            outputs = None
            if to_region:
                o = httpclient.InferRequestedOutput("OUTPUT0")
                o.set_shared_memory(f"out{tag}", 16, 0)
                outputs = [o]
            return c.infer("cached_add_sub", [i0, i1], outputs=outputs)

        before = stats(kernel, "cached_add_sub")["inference_stats"]
        executed = count(run(False))
        assert count(infer(c, "cached_add_sub", a, b)) == executed  # the inline request hits the same entry
        run(True)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.float32, [4]), a + b)
        after = stats(kernel, "cached_add_sub")["inference_stats"]
        assert after["cache_miss"]["count"] - before["cache_miss"]["count"] == 1
        assert after["cache_hit"]["count"] - before["cache_hit"]["count"] == 2
    finally:
        c.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
        c.close()


def test_an_ensemble_caches_its_top_level_response(kernel):
    """As tritonserver 2.51: a hit on the ensemble runs none of its steps."""
    c = httpclient.InferenceServerClient(kernel.url)
    a = httpclient.InferInput("A", [4], "FP32")
    a.set_data_from_numpy(np.array([3, 1, 4, 1], dtype=np.float32))
    b = httpclient.InferInput("B", [4], "FP32")
    b.set_data_from_numpy(np.array([5, 9, 2, 6], dtype=np.float32))
    first = c.infer("cached_ensemble", [a, b])
    step_before = stats(kernel, "plain_add_sub")["execution_count"]
    for _ in range(3):
        again = c.infer("cached_ensemble", [a, b])
        np.testing.assert_array_equal(again.as_numpy("SUM"), [8, 10, 6, 7])
        assert again.as_numpy("N").tolist() == first.as_numpy("N").tolist()
    assert stats(kernel, "plain_add_sub")["execution_count"] == step_before
    s = stats(kernel, "cached_ensemble")["inference_stats"]
    assert (s["cache_hit"]["count"], s["cache_miss"]["count"]) == (3, 1)
    c.close()
