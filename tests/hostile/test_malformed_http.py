"""Malformed KServe v2 JSON requests: each is a 400 naming the problem, and the server carries on.

Issue 14, items 1, 2 and 12. The messages are real Triton 2.51's (checked with
`python benchmarks/peers.py triton`); where Triton answers 500 for a client's mistake we answer 400.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from conftest import KernelProcess, free_ports, running, wait_until_ok

MODELS = Path(__file__).resolve().parent / "models"
VERTEX_PREDICT = "/v1/endpoints/1/deployedModels/2:predict"
VERTEX_HEALTH = "/v1/endpoints/1/deployedModels/2"


class Fronts:
    """One server: KServe HTTP, SageMaker /invocations and Vertex AI predict, all on seq_echo by default."""

    def __init__(self, k: KernelProcess, sagemaker_port: int, vertex_port: int):
        self.k = k
        self.http = httpx.Client(base_url=f"http://{k.url}", timeout=30)
        self.sagemaker = httpx.Client(base_url=f"http://127.0.0.1:{sagemaker_port}", timeout=30)
        self.vertex = httpx.Client(base_url=f"http://127.0.0.1:{vertex_port}", timeout=30)


@pytest.fixture(scope="module")
def fronts():
    sm, vx = free_ports(2)
    k = KernelProcess(
        [MODELS], "--allow-sagemaker=true", f"--sagemaker-port={sm}", "--allow-vertex-ai=true",
        f"--vertex-ai-port={vx}", "--vertex-ai-default-model=seq_echo",
        env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "seq_echo", "AIP_PREDICT_ROUTE": VERTEX_PREDICT,
             "AIP_HEALTH_ROUTE": VERTEX_HEALTH},
    )
    for ready in running(k):
        wait_until_ok(k, [f"http://127.0.0.1:{sm}/ping", f"http://127.0.0.1:{vx}{VERTEX_HEALTH}"])
        yield Fronts(ready, sm, vx)


def add_sub(data0=(1, 2, 3, 4), datatype="FP32", shape=(4,), **params) -> dict:
    body = {"inputs": [
        {"name": "INPUT0", "shape": list(shape), "datatype": datatype, "data": list(data0)},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]},
    ]}
    if params:
        body["parameters"] = params
    return body


def seq(**params) -> dict:
    return {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [7]}], "parameters": params}


def assert_serving(f: Fronts, model: str = "add_sub_x2") -> None:
    """A normal request still gets its answer (the model is neither wedged nor without workers)."""
    r = f.http.post(f"/v2/models/{model}/infer", json=add_sub(), timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [2, 3, 4, 5]


def assert_refused(r: httpx.Response, *words: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    for w in words:
        assert w in r.json()["error"], r.text


BAD_SEQUENCE_IDS = [2**64, 2**70, -1, None, True, 1.5, [1], {}]


@pytest.mark.parametrize("value", BAD_SEQUENCE_IDS, ids=repr)
def test_bad_sequence_id_is_refused_on_every_front(fronts, value):
    msg = "Unable to parse 'sequence_id': attempt to access JSON non-string as string"
    assert_refused(fronts.http.post("/v2/models/seq_echo/infer", json=seq(sequence_id=value, sequence_start=True)), msg)
    assert_refused(fronts.sagemaker.post("/invocations", json=seq(sequence_id=value, sequence_start=True)), msg)
    assert_refused(fronts.vertex.post(VERTEX_PREDICT, json=seq(sequence_id=value, sequence_start=True)), msg)
    # The sequence model's worker is alive: a good sequence still runs.
    r = fronts.http.post("/v2/models/seq_echo/infer", json=seq(sequence_id=42, sequence_start=True, sequence_end=True))
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [7]


def test_sequence_id_2_64_never_wedges_a_two_instance_model(fronts):
    """Issue 14 item 1: the request was counted as executing before its frame failed to encode."""
    for _ in range(4):
        assert_refused(fronts.http.post("/v2/models/add_sub_x2/infer", json=add_sub(sequence_id=2**64)), "sequence_id")
    for _ in range(4):
        assert_serving(fronts)
    metrics = httpx.get(f"http://127.0.0.1:{fronts.k.metrics_port}/metrics", timeout=10).text
    pending = [line for line in metrics.splitlines()
               if line.startswith("nv_inference_pending_request_count") and 'model="add_sub_x2"' in line]
    assert pending and all(line.endswith(" 0") for line in pending), pending


def test_largest_and_string_sequence_ids_are_accepted(fronts):
    for value in (2**64 - 1, "a-string-id"):
        r = fronts.http.post("/v2/models/seq_echo/infer",
                             json=seq(sequence_id=value, sequence_start=True, sequence_end=True))
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("params, message", [
    ({"sequence_id": 5, "sequence_start": 1}, "Unable to parse 'sequence_start': attempt to access JSON non-boolean"),
    ({"sequence_id": 5, "sequence_end": "x"}, "Unable to parse 'sequence_end': attempt to access JSON non-boolean"),
    ({"priority": "high"}, "Unable to parse 'priority': attempt to access JSON non-unsigned-integer"),
    ({"priority": -1}, "Unable to parse 'priority'"),
    ({"priority": 1.5}, "Unable to parse 'priority'"),
    ({"timeout": "soon"}, "Unable to parse 'timeout': attempt to access JSON non-unsigned-integer"),
    ({"timeout": 2**64}, "Unable to parse 'timeout'"),
    ({"binary_data_output": "yes"}, "Unable to parse 'binary_data_output': attempt to access JSON non-boolean"),
    ({"custom": None}, "parameter 'custom' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"custom": [1]}, "parameter 'custom' has invalid type"),
    ({"custom": {}}, "parameter 'custom' has invalid type"),
    ({"triton_anything": True}, "parameter keys starting with 'triton_' are reserved for Triton usage"),
])
def test_bad_parameters_are_400(fronts, params, message):
    assert_refused(fronts.http.post("/v2/models/add_sub_x2/infer", json=add_sub(**params)), message)
    assert_serving(fronts)


def test_good_model_parameters_pass(fronts):
    r = fronts.http.post("/v2/models/add_sub_x2/infer",
                         json=add_sub(custom=1.5, other="x", flag=True, big=2**64, priority=0, timeout=0))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("model, tensor, message", [
    ("add_sub_x2", {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": ["1", 2, 3, 4]},
     "Unable to parse 'data': attempt to access JSON non-number as double"),
    ("add_sub_x2", {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [True, 2, 3, 4]},
     "attempt to access JSON non-number as double"),
    ("add_sub_x2", {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [None, 2, 3, 4]},
     "attempt to access JSON non-number as double"),
    ("echo", {"name": "IN", "shape": [2], "datatype": "INT32", "data": [1.5, 2]},
     "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ("echo", {"name": "IN", "shape": [2], "datatype": "INT32", "data": ["7", 2]},
     "attempt to access JSON non-signed-integer as signed-integer"),
    ("echo", {"name": "IN", "shape": [2], "datatype": "INT32", "data": [True, 2]},
     "attempt to access JSON non-signed-integer as signed-integer"),
    ("echo", {"name": "IN", "shape": [2], "datatype": "INT32", "data": [2**40, 2]}, "out of bounds for int32"),
    ("echo", {"name": "U", "shape": [2], "datatype": "UINT8", "data": [-1, 2]},
     "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer"),
])
def test_json_data_is_never_coerced(fronts, model, tensor, message):
    body = add_sub() if model == "add_sub_x2" else {"inputs": []}
    body["inputs"][0:1] = [tensor]
    assert_refused(fronts.http.post(f"/v2/models/{model}/infer", json=body), message)
    assert_serving(fronts)


def test_nested_json_data_still_reads_row_major(fronts):
    r = fronts.http.post("/v2/models/add_sub_x2/infer", json=add_sub(data0=[[1, 2], [3, 4]]))
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [2, 3, 4, 5]


def test_hundred_dimension_shape_is_400(fronts):
    # (issue 31: a shape may have at most 64 dimensions, numpy's limit; tritonserver has none and
    # answers the model's shape mismatch instead)
    r = fronts.http.post("/v2/models/add_sub_x2/infer", json=add_sub(shape=[1] * 98 + [2, 2]))
    assert_refused(r, "the shape of input 'INPUT0' has 100 dimensions, more than the 64 a tensor may have")
    assert_serving(fronts)


def test_deeply_nested_json_is_400(fronts):
    deep = b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":' + b"[" * 100_000 + b"]" * 100_000 + b"}]}"
    assert_refused(fronts.http.post("/v2/models/add_sub_x2/infer", content=deep), "nested too deeply")
    assert_serving(fronts)


@pytest.mark.parametrize("path", ["/v2/models/add_sub_x2/generate", "/v2/repository/models/x/load",
                                  "/v2/systemsharedmemory/region/x/register", "/v2/logging", "/v2/trace/setting"])
def test_deeply_nested_json_is_400_on_every_route(fronts, path):
    deep = b'{"INPUT0":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    # (A control route counts its JSON's values before decoding it: 100 000 arrays are too many.)
    expected = "nested too deeply" if path.endswith("/generate") else "more than 65536 JSON values"
    assert_refused(fronts.http.post(path, content=deep), expected)
    assert_serving(fronts)


def test_deeply_nested_json_is_400_through_sagemaker_and_vertex(fronts):
    deep = (b'{"inputs":[{"name":"IN","shape":[1],"datatype":"INT32","data":' + b"[" * 100_000 + b"]" * 100_000
            + b"}]}")
    assert_refused(fronts.sagemaker.post("/invocations", content=deep), "nested too deeply")
    assert_refused(fronts.vertex.post(VERTEX_PREDICT, content=deep), "nested too deeply")
    assert_serving(fronts)
