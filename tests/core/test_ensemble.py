"""Ensembles run by the core: pipelines, requested outputs, nesting, a failing step,
a decoupled step streaming through the ensemble, and load-time dependency errors."""

from __future__ import annotations

import json
import queue
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TEST_MODELS, serving

REPO = TEST_MODELS / "scheduling" / "ensembles"
BAD_REPO = TEST_MODELS / "scheduling" / "ensembles_bad"

X = np.array([1, 2, 3, 4], np.float32)
Y = np.array([1, 1, 1, 1], np.float32)


@pytest.fixture(scope="module")
def kernel():
    yield from serving([REPO])


@pytest.fixture
def client(kernel):
    c = httpclient.InferenceServerClient(kernel.url, concurrency=8)
    yield c
    c.close()


def tensor(name, arr, module=httpclient):
    from tritonclient.utils import np_to_triton_dtype

    t = module.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
    t.set_data_from_numpy(arr)
    return t


def test_ensemble_runs_its_steps_in_order(client):
    r = client.infer("ens_pipeline", [tensor("X", X), tensor("Y", Y)])
    np.testing.assert_array_equal(r.as_numpy("Z"), (X + Y) * (X - Y))
    np.testing.assert_array_equal(r.as_numpy("S"), X + Y)


def test_ensemble_returns_only_the_requested_outputs(client):
    r = client.infer("ens_pipeline", [tensor("X", X), tensor("Y", Y)], outputs=[httpclient.InferRequestedOutput("Z")])
    assert [o["name"] for o in r.get_response()["outputs"]] == ["Z"]


def test_ensemble_metadata_ready_and_config(kernel, client):
    assert client.is_model_ready("ens_pipeline")
    meta = client.get_model_metadata("ens_pipeline")
    assert meta["platform"] == "ensemble"
    assert [i["name"] for i in meta["inputs"]] == ["X", "Y"]
    config = client.get_model_config("ens_pipeline")
    assert config["platform"] == "ensemble"
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["ens_addsub", "ens_mul"]


def test_ensemble_of_an_ensemble(client):
    r = client.infer("ens_nested", [tensor("X", X), tensor("Y", Y), tensor("ONES", np.ones(4, np.float32))])
    np.testing.assert_array_equal(r.as_numpy("Z2"), (X + Y) * (X - Y))


def test_concurrent_ensemble_requests(client):
    futures = [client.async_infer("ens_pipeline", [tensor("X", X * i), tensor("Y", Y)]) for i in range(1, 9)]
    for i, f in zip(range(1, 9), futures):
        np.testing.assert_array_equal(f.get_result().as_numpy("Z"), (X * i + Y) * (X * i - Y))


def test_failing_step_fails_the_request_cleanly(kernel, client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("ens_pipeline", [tensor("X", -X - 5), tensor("Y", Y)])
    assert info.value.message() == "in ensemble 'ens_pipeline', negative input to ens_mul"
    # The ensemble keeps serving.
    r = client.infer("ens_pipeline", [tensor("X", X), tensor("Y", Y)])
    np.testing.assert_array_equal(r.as_numpy("Z"), (X + Y) * (X - Y))
    with urllib.request.urlopen(f"http://{kernel.url}/v2/models/ens_pipeline/stats") as resp:
        s = json.loads(resp.read())["model_stats"][0]
    assert s["inference_stats"]["fail"]["count"] >= 1
    assert s["inference_stats"]["success"]["count"] >= 1


def test_invalid_input_to_an_ensemble_is_refused_up_front(client):
    with pytest.raises(InferenceServerException, match="unexpected inference input 'W'"):
        client.infer("ens_pipeline", [tensor("X", X), tensor("W", Y)])


def test_decoupled_step_streams_through_the_ensemble(kernel):
    c = grpcclient.InferenceServerClient(kernel.grpc_url)
    got: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        c.async_stream_infer(
            "ens_stream",
            [tensor("X", X, grpcclient), tensor("COUNT", np.array([3], np.int32), grpcclient)],
            enable_empty_final_response=True,
        )
        outputs = []
        while True:
            result, error = got.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                outputs.append(result.as_numpy("Z"))
            if response.parameters["triton_final_response"].bool_param:
                break
        assert len(outputs) == 3
        for i, z in enumerate(outputs, start=1):
            np.testing.assert_array_equal(z, (X * i) ** 2)
    finally:
        c.stop_stream()
        c.close()


def test_ensemble_with_a_missing_model_fails_to_load(start_kernel):
    k = start_kernel([BAD_REPO], "--exit-on-error=false", "--strict-readiness=false").wait_ready()
    c = httpclient.InferenceServerClient(k.url)
    try:
        assert not c.is_model_ready("ens_missing")
    finally:
        c.close()
    assert "ensemble ens_missing contains models that are not available or ambiguous: no_such_model" in k.log()
