"""The statistics extension: GET /v2/models[/<m>[/versions/<v>]]/stats and gRPC ModelStatistics,
with Triton's JSON fields and counting rules."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TEST_MODELS, serving

REPO = TEST_MODELS / "scheduling" / "statistics"

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


@pytest.fixture(scope="module")
def kernel():
    yield from serving([REPO])


@pytest.fixture
def client(kernel):
    c = httpclient.InferenceServerClient(kernel.url, concurrency=8)
    yield c
    c.close()


def get(kernel, path: str):
    try:
        with urllib.request.urlopen(f"http://{kernel.url}{path}") as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def plain_inputs(value: float = 1.0):
    a = np.full(4, value, np.float32)
    out = []
    for name in ("INPUT0", "INPUT1"):
        t = httpclient.InferInput(name, [4], "FP32")
        t.set_data_from_numpy(a)
        out.append(t)
    return out


def error_input(value: float, rows: int = 1):
    t = httpclient.InferInput("INPUT0", [rows, 4], "FP32")
    t.set_data_from_numpy(np.full((rows, 4), value, np.float32))
    return [t]


def test_statistics_is_an_advertised_extension(client):
    assert "statistics" in client.get_server_metadata()["extensions"]


def test_all_models_statistics_shape(kernel):
    status, body = get(kernel, "/v2/models/stats")
    assert status == 200
    names = [m["name"] for m in body["model_stats"]]
    assert names == sorted(names) and {"stats_plain", "stats_error"} <= set(names)
    for m in body["model_stats"]:
        assert set(m) == {
            "name", "version", "last_inference", "inference_count", "execution_count", "inference_stats",
            "response_stats", "batch_stats", "memory_usage",
        }
        assert set(m["inference_stats"]) == set(DURATIONS)
        for d in m["inference_stats"].values():
            assert set(d) == {"count", "ns"}


def test_counts_and_durations_for_plain_requests(kernel, client):
    before = get(kernel, "/v2/models/stats_plain/stats")[1]["model_stats"][0]
    for i in range(5):
        client.infer("stats_plain", plain_inputs(float(i)))
    status, body = get(kernel, "/v2/models/stats_plain/versions/1/stats")
    assert status == 200
    (m,) = body["model_stats"]
    assert m["name"] == "stats_plain" and m["version"] == "1"
    assert m["inference_count"] == before["inference_count"] + 5
    assert m["execution_count"] == before["execution_count"] + 5
    s = m["inference_stats"]
    assert s["success"]["count"] == before["inference_stats"]["success"]["count"] + 5
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert s[name]["count"] == s["success"]["count"]
        assert s[name]["ns"] > 0
    assert s["success"]["ns"] >= s["compute_infer"]["ns"]
    assert s["fail"]["count"] == 0
    assert m["batch_stats"][0]["batch_size"] == 1
    assert m["batch_stats"][0]["compute_infer"]["count"] == m["execution_count"]
    assert abs(m["last_inference"] / 1000 - time.time()) < 600  # ms since the epoch
    assert m["response_stats"] == {} and m["memory_usage"] == []


def test_failures_are_counted(kernel, client):
    before = get(kernel, "/v2/models/stats_error/stats")[1]["model_stats"][0]
    with pytest.raises(InferenceServerException, match="negative input"):
        client.infer("stats_error", error_input(-1.0))
    with pytest.raises(InferenceServerException, match="NaN input"):
        client.infer("stats_error", error_input(float("nan")))
    client.infer("stats_error", error_input(2.0, rows=3))
    m = get(kernel, "/v2/models/stats_error/stats")[1]["model_stats"][0]
    s, b = m["inference_stats"], before["inference_stats"]
    # execute raising fails its requests; a response carrying the model's error is a success, as
    # tritonserver 2.51 counts it (the execution succeeded)
    assert s["fail"]["count"] == b["fail"]["count"] + 1
    assert s["fail"]["ns"] > b["fail"]["ns"]
    assert s["success"]["count"] == b["success"]["count"] + 2
    assert m["inference_count"] == before["inference_count"] + 4  # a batch-3 request counts 3
    assert {x["batch_size"] for x in m["batch_stats"]} >= {1, 3}


def test_unknown_model_and_version(kernel):
    status, body = get(kernel, "/v2/models/nope/stats")
    assert status == 400 and body == {"error": "requested model 'nope' is not available"}
    status, body = get(kernel, "/v2/models/stats_plain/versions/7/stats")
    assert status == 400 and body == {"error": "requested model version is not available for model 'stats_plain'"}


def test_statistics_rejects_other_methods(kernel):
    req = urllib.request.Request(f"http://{kernel.url}/v2/models/stats_plain/stats", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req)
    assert info.value.code == 405


def test_tritonclient_http_and_grpc_read_statistics(kernel, client):
    client.infer("stats_plain", plain_inputs())
    http_stats = client.get_inference_statistics("stats_plain")
    assert http_stats["model_stats"][0]["inference_stats"]["success"]["count"] >= 1
    g = grpcclient.InferenceServerClient(kernel.grpc_url)
    try:
        grpc_stats = g.get_inference_statistics("stats_plain", as_json=True)
    finally:
        g.close()
    (m,) = grpc_stats["model_stats"]
    assert m["name"] == "stats_plain"
    assert int(m["inference_stats"]["success"]["count"]) >= 1
    everything = client.get_inference_statistics()
    assert {"stats_plain", "stats_error"} <= {x["name"] for x in everything["model_stats"]}
