"""Prometheus metrics on --metrics-port: Triton's nv_* families and labels, --metrics-config,
--allow-metrics, and models' custom metrics (pb_utils.MetricFamily), scraped and parsed with
prometheus_client's own parser."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from conftest import TEST_MODELS, serving

REPOS = [TEST_MODELS / "scheduling" / "statistics", TEST_MODELS / "scheduling" / "metrics"]


@pytest.fixture(scope="module")
def kernel():
    yield from serving(REPOS)


@pytest.fixture
def client(kernel):
    c = httpclient.InferenceServerClient(kernel.url, concurrency=8)
    yield c
    c.close()


def scrape_text(k) -> str:
    with urllib.request.urlopen(f"http://localhost:{k.metrics_port}/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return r.read().decode()


def scrape(k) -> dict:
    """{family name: {(sample name, frozenset(labels)): value}}"""
    out: dict = {}
    for family in text_string_to_metric_families(scrape_text(k)):
        samples = out.setdefault(family.name, {})
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def sample(metrics, family, name=None, **labels):
    samples = metrics[family]
    key = (name or family, frozenset(labels.items()))
    if key not in samples:  # the parser reports counter samples as <name>_total
        key = (key[0] + "_total", key[1])
    return samples[key]


def plain_inputs():
    out = []
    for name in ("INPUT0", "INPUT1"):
        t = httpclient.InferInput(name, [4], "FP32")
        t.set_data_from_numpy(np.ones(4, np.float32))
        out.append(t)
    return out


def probe(client, value: float, action: str = "count"):
    v = httpclient.InferInput("VALUE", [1], "FP32")
    v.set_data_from_numpy(np.array([value], np.float32))
    a = httpclient.InferInput("ACTION", [1], "BYTES")
    a.set_data_from_numpy(np.array([action.encode()], np.object_))
    r = client.infer("custom_metrics_probe", [v, a])
    return float(r.as_numpy("COUNTER_VALUE")[0]), float(r.as_numpy("GAUGE_VALUE")[0]), r.as_numpy("MESSAGE")[0].decode()


def test_inference_metrics_match_statistics(kernel, client):
    for _ in range(4):
        client.infer("stats_plain", plain_inputs())
    stats = client.get_inference_statistics("stats_plain")["model_stats"][0]
    m = scrape(kernel)
    labels = {"model": "stats_plain", "version": "1"}
    success = stats["inference_stats"]["success"]["count"]
    assert success >= 4
    assert sample(m, "nv_inference_request_success", **labels) == success
    assert sample(m, "nv_inference_count", **labels) == stats["inference_count"]
    assert sample(m, "nv_inference_exec_count", **labels) == stats["execution_count"]
    for family, key in (
        ("nv_inference_request_duration_us", "success"),
        ("nv_inference_queue_duration_us", "queue"),
        ("nv_inference_compute_input_duration_us", "compute_input"),
        ("nv_inference_compute_infer_duration_us", "compute_infer"),
        ("nv_inference_compute_output_duration_us", "compute_output"),
    ):
        assert sample(m, family, **labels) == stats["inference_stats"][key]["ns"] // 1000
    assert sample(m, "nv_inference_pending_request_count", **labels) == 0
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert sample(m, "nv_inference_request_failure", reason=reason, **labels) == 0
    assert sample(m, "nv_model_load_duration_secs", **labels) > 0
    assert 0.0 <= sample(m, "nv_cpu_utilization") <= 1.0
    assert sample(m, "nv_cpu_memory_total_bytes") > 0


def test_metric_names_are_tritons_exactly(kernel):
    text = scrape_text(kernel)
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes\n" in text
    assert "# TYPE nv_inference_pending_request_count gauge\n" in text
    assert not [line for line in text.splitlines() if line.startswith("nv_inference") and "_total" in line]
    assert 'nv_inference_request_success{model="stats_plain",version="1"}' in text


def test_failures_are_counted_by_reason(kernel, client):
    t = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    t.set_data_from_numpy(np.full((1, 4), np.nan, np.float32))  # execute raises: a BACKEND failure
    with pytest.raises(InferenceServerException):
        client.infer("stats_error", [t])
    futures = [client.async_infer("metrics_timeout", [*_batched_inputs()]) for _ in range(3)]
    rejected = 0
    for f in futures:
        try:
            f.get_result()
        except InferenceServerException as exc:
            assert exc.message() == "Request timeout expired"
            rejected += 1
    assert rejected >= 1
    m = scrape(kernel)
    assert sample(m, "nv_inference_request_failure", model="stats_error", version="1", reason="BACKEND") >= 1
    assert sample(m, "nv_inference_request_failure", model="metrics_timeout", version="1",
                  reason="REJECTED") == rejected


def _batched_inputs():
    out = []
    for name in ("INPUT0", "INPUT1"):
        t = httpclient.InferInput(name, [1, 4], "FP32")
        t.set_data_from_numpy(np.ones((1, 4), np.float32))
        out.append(t)
    return out


def test_other_paths_and_methods(kernel):
    with urllib.request.urlopen(f"http://localhost:{kernel.metrics_port}/elsewhere") as r:
        assert r.status == 200 and r.read() == b""
    req = urllib.request.Request(f"http://localhost:{kernel.metrics_port}/metrics", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req)
    assert info.value.code == 405


# ---- custom metrics ---------------------------------------------------------------------------


def test_custom_counter_gauge_histogram(kernel, client):
    values = [1.0, 2.0, 30.0, 400.0]
    results = [probe(client, v) for v in values]
    assert [r[0] for r in results] == [1.0, 3.0, 33.0, 433.0]  # value() reads the current value
    assert results[-1][1] == 400.0
    m = scrape(kernel)
    labels = {"model": "custom_metrics_probe", "version": "1"}
    assert sample(m, "probe_requests_total_value", **labels) == 433.0
    assert sample(m, "probe_last_value", **labels) == 400.0
    hist = "probe_value_histogram"
    assert sample(m, hist, hist + "_count", **labels) == 4
    assert sample(m, hist, hist + "_sum", **labels) == 433.0
    assert sample(m, hist, hist + "_bucket", le="1", **labels) == 1
    assert sample(m, hist, hist + "_bucket", le="10", **labels) == 2
    assert sample(m, hist, hist + "_bucket", le="100", **labels) == 3
    assert sample(m, hist, hist + "_bucket", le="+Inf", **labels) == 4
    text = scrape_text(kernel)
    assert "# HELP probe_requests_total_value Sum of VALUE over requests\n" in text
    assert "# TYPE probe_requests_total_value counter\n" in text


def test_custom_metrics_are_shared_across_instances(kernel):
    # Two instances create the same family and labels: one metric, both add to it.
    start = sample(scrape(kernel), "probe_requests_total_value", model="custom_metrics_probe", version="1")
    c = httpclient.InferenceServerClient(kernel.url, concurrency=8)
    try:
        futures = []
        for _ in range(8):
            v = httpclient.InferInput("VALUE", [1], "FP32")
            v.set_data_from_numpy(np.array([1.0], np.float32))
            a = httpclient.InferInput("ACTION", [1], "BYTES")
            a.set_data_from_numpy(np.array([b"count"], np.object_))
            futures.append(c.async_infer("custom_metrics_probe", [v, a]))
        seen = [float(f.get_result().as_numpy("COUNTER_VALUE")[0]) for f in futures]
    finally:
        c.close()
    end = sample(scrape(kernel), "probe_requests_total_value", model="custom_metrics_probe", version="1")
    assert end == start + 8
    assert max(seen) == end


def test_deleted_metric_disappears(kernel, client):
    probe(client, 5.0, "temp_add")
    assert sample(scrape(kernel), "probe_last_value", kind="temporary") == 5.0
    probe(client, 0.0, "temp_del")
    assert ("probe_last_value", frozenset({"kind": "temporary"}.items())) not in scrape(kernel)["probe_last_value"]


def test_custom_metric_errors(client):
    assert probe(client, 0.0, "conflict")[2] == (
        "Error when creating MetricFamily: Family name already exists with different type"
    )
    assert probe(client, 0.0, "negative")[2] == (
        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
        "monotonically by non-negative values."
    )
    assert probe(client, 0.0, "del_family")[2].startswith(
        "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
    )


# ---- --metrics-config and --allow-metrics ---------------------------------------------------------------


def test_summaries_and_histograms_from_metrics_config(start_kernel):
    k = start_kernel(
        [REPOS[0]], "--metrics-config", "summary_latencies=true", "--metrics-config", "histogram_latencies=true",
        "--metrics-config", "summary_quantiles=0.5:0.05,0.9:0.01",
    ).wait_ready()
    c = httpclient.InferenceServerClient(k.url)
    try:
        for _ in range(3):
            c.infer("stats_plain", plain_inputs())
    finally:
        c.close()
    m = scrape(k)
    labels = {"model": "stats_plain", "version": "1"}
    summary = "nv_inference_queue_summary_us"
    assert sample(m, summary, summary + "_count", **labels) == 3
    assert {dict(key)["quantile"] for (name, key) in m[summary] if name == summary} == {"0.5", "0.9"}
    for name in ("nv_inference_request_summary_us", "nv_inference_compute_input_summary_us",
                 "nv_inference_compute_infer_summary_us", "nv_inference_compute_output_summary_us"):
        assert sample(m, name, name + "_count", **labels) == 3
    hist = "nv_inference_first_response_histogram_ms"
    assert sample(m, hist, hist + "_count", **labels) == 3
    assert {dict(key)["le"] for (name, key) in m[hist] if name == hist + "_bucket"} == {
        "100", "500", "2000", "5000", "+Inf"}
    # The counters stay on by default.
    assert sample(m, "nv_inference_request_duration_us", **labels) > 0


def test_counter_latencies_can_be_turned_off(start_kernel):
    k = start_kernel([REPOS[0]], "--metrics-config=counter_latencies=false").wait_ready()
    m = scrape(k)
    assert "nv_inference_request_success" in m
    assert "nv_inference_request_duration_us" not in m


def test_metrics_can_be_disabled(start_kernel):
    k = start_kernel([REPOS[0]], "--allow-metrics=false").wait_ready()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", k.metrics_port)) != 0
    assert "Metrics Service" not in k.log()
