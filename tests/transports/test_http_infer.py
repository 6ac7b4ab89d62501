"""Inference over HTTP with the real tritonclient against a `kernel serve` subprocess."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype


def _inputs(binary: bool, **arrays):
    out = []
    for name, arr in arrays.items():
        t = httpclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        t.set_data_from_numpy(arr, binary_data=binary)
        out.append(t)
    return out


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_add_sub(http_client, binary):
    a = np.random.rand(4).astype(np.float32)
    b = np.random.rand(4).astype(np.float32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = http_client.infer("add_sub", _inputs(binary, INPUT0=a, INPUT1=b), request_id="42", outputs=outputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    response = result.get_response()
    assert response["id"] == "42"
    assert response["model_name"] == "add_sub"
    assert response["model_version"] == "1"


def test_requested_outputs_filter_the_response(http_client):
    a = np.ones(4, np.float32)
    result = http_client.infer(
        "add_sub", _inputs(True, INPUT0=a, INPUT1=a), outputs=[httpclient.InferRequestedOutput("OUTPUT1")]
    )
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros(4, np.float32))


def test_explicit_version(http_client):
    a = np.ones(4, np.float32)
    result = http_client.infer("add_sub", _inputs(True, INPUT0=a, INPUT1=a), model_version="1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_strings_round_trip(http_client, binary):
    data = np.array([["hello", "wörld", "", "a b c"]], dtype=np.object_)
    t = httpclient.InferInput("INPUT0", [1, 4], "BYTES")
    t.set_data_from_numpy(data, binary_data=binary)
    result = http_client.infer(
        "string_identity", [t], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    )
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (1, 4)
    assert [x.decode() if isinstance(x, bytes) else x for x in out.reshape(-1)] == ["hello", "wörld", "", "a b c"]


@pytest.mark.parametrize(
    "dtype",
    [np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
     np.float16, np.float32, np.float64],
)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_every_numeric_dtype(http_client, dtype, binary):
    triton_type = np_to_triton_dtype(np.dtype(dtype))
    name = "STRING" if triton_type == "BYTES" else triton_type
    rng = np.random.default_rng(0)
    data = (rng.integers(0, 2, 5) if dtype == np.bool_ else rng.integers(0, 100, 5)).astype(dtype)
    t = httpclient.InferInput(f"IN_{name}", [5], triton_type)
    t.set_data_from_numpy(data, binary_data=binary)
    result = http_client.infer(
        "dtype_echo", [t], outputs=[httpclient.InferRequestedOutput(f"OUT_{name}", binary_data=binary)]
    )
    out = result.as_numpy(f"OUT_{name}")
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, data)


def test_optional_inputs_may_be_left_out(http_client):
    a = np.arange(3, dtype=np.int32)
    b = np.array([1.5, 2.5], dtype=np.float64)
    result = http_client.infer("dtype_echo", _inputs(True, IN_INT32=a, IN_FP64=b))
    np.testing.assert_array_equal(result.as_numpy("OUT_INT32"), a)
    np.testing.assert_array_equal(result.as_numpy("OUT_FP64"), b)
    assert result.as_numpy("OUT_FP32") is None


@pytest.mark.parametrize("n", [70_000, 5_000_000])
def test_large_tensors_cross_the_arena(http_client, n):
    # Above 64 KiB tensors travel through the shared-memory arena, not inline.
    data = np.random.rand(n).astype(np.float32)
    result = http_client.infer("dtype_echo", _inputs(True, IN_FP32=data))
    np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)


def test_auto_completed_model_serves_and_reports_its_config(http_client):
    config = http_client.get_model_config("auto_add")
    assert config["max_batch_size"] == 16
    assert [i["name"] for i in config["input"]] == ["A", "B"]
    assert config["output"][0]["name"] == "SUM"
    a = np.array([[1, 2, 3]], dtype=np.int32)
    result = http_client.infer("auto_add", _inputs(False, A=a, B=a))
    np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * a)


def test_health_and_metadata(server, http_client):
    assert http_client.is_server_live()
    assert http_client.is_server_ready()
    assert http_client.is_model_ready("add_sub")
    assert http_client.is_model_ready("add_sub", "1")
    assert not http_client.is_model_ready("add_sub", "7")
    assert not http_client.is_model_ready("no_such_model")
    meta = http_client.get_server_metadata()
    assert "binary_tensor_data" in meta["extensions"]
    model = http_client.get_model_metadata("add_sub")
    assert model["name"] == "add_sub"
    assert model["versions"] == ["1"]
    assert model["platform"] == "python"
    assert model["inputs"] == [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4]},
    ]
    batched = http_client.get_model_metadata("string_identity")
    assert batched["inputs"][0]["shape"] == [-1, -1]


def test_config_is_rendered_like_triton(http_client):
    config = http_client.get_model_config("add_sub")
    assert config["name"] == "add_sub"
    assert config["backend"] == "python"
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == [4]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["instance_group"][0]["count"] == 1
    assert config["version_policy"] == {"latest": {"num_versions": 1}}


def test_raw_json_request_without_client(server):
    body = json.dumps(
        {
            "id": "raw",
            "inputs": [
                {"name": "INPUT0", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]},
                {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]},
            ],
        }
    ).encode()
    # INPUT0 has the wrong shape for add_sub ([4]); the dtype_echo model takes any 1-D shape.
    req = urllib.request.Request(f"http://{server.url}/v2/models/add_sub/infer", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req)
    assert info.value.code == 400
    assert "unexpected shape for input 'INPUT0'" in json.loads(info.value.read())["error"]
    body = json.dumps(
        {"id": "raw", "inputs": [{"name": "IN_FP32", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}
    ).encode()
    req = urllib.request.Request(f"http://{server.url}/v2/models/dtype_echo/infer", data=body, method="POST")
    with urllib.request.urlopen(req) as r:
        assert r.headers["Content-Type"] == "application/json"
        doc = json.loads(r.read())
    assert doc["id"] == "raw"
    assert doc["outputs"] == [{"name": "OUT_FP32", "datatype": "FP32", "shape": [3], "data": [1.0, 2.0, 3.0]}]


def test_many_concurrent_requests_all_answered(server):
    client = httpclient.InferenceServerClient(server.url, concurrency=16)
    try:
        pending = []
        for i in range(200):
            a = np.full(4, i, np.float32)
            pending.append((i, client.async_infer("add_sub", _inputs(True, INPUT0=a, INPUT1=a))))
        for i, p in pending:
            np.testing.assert_array_equal(p.get_result().as_numpy("OUTPUT0"), np.full(4, 2 * i, np.float32))
    finally:
        client.close()


def test_small_arena_settings_grow_to_fit(start_kernel):
    from conftest import TEST_MODELS

    k = start_kernel(
        [TEST_MODELS / "good"],
        "--backend-config", "python,shm-default-byte-size=1048576",
        "--backend-config", "python,shm-growth-byte-size=1048576",
    ).wait_ready()
    client = httpclient.InferenceServerClient(k.url)
    data = np.random.rand(3_000_000).astype(np.float32)  # 12 MB: needs several growth steps
    result = client.infer("dtype_echo", _inputs(True, IN_FP32=data))
    np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)


def test_hypercorn_serves_the_same_api(start_kernel):
    from conftest import EXAMPLES

    k = start_kernel([EXAMPLES], "--http-server", "hypercorn").wait_ready()
    client = httpclient.InferenceServerClient(k.url)
    a = np.arange(4, dtype=np.float32)
    for binary in (False, True):
        result = client.infer("add_sub", _inputs(binary, INPUT0=a, INPUT1=a))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
    assert client.get_model_metadata("add_sub")["name"] == "add_sub"
