"""Python backend features a model.py author relies on, seen through tritonclient over HTTP."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, TEST_MODELS


def tensor(name, arr, datatype=None):
    from tritonclient.utils import np_to_triton_dtype

    t = httpclient.InferInput(name, list(arr.shape), datatype or np_to_triton_dtype(arr.dtype))
    t.set_data_from_numpy(arr)
    return t


def test_bls_sync_exec_through_the_core(http_client):
    a = np.arange(4, dtype=np.float32)
    b = np.ones(4, dtype=np.float32)
    result = http_client.infer("bls_add_sub", [tensor("INPUT0", a), tensor("INPUT1", b)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_to_an_unknown_model_is_an_error_response(http_client):
    a = np.ones(4, dtype=np.float32)
    target = tensor("TARGET", np.array([b"missing_model"], dtype=np.object_), "BYTES")
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("bls_add_sub", [tensor("INPUT0", a), tensor("INPUT1", a), target])
    assert "Request for unknown model: 'missing_model' is not found" in info.value.message()


def test_bls_self_call_without_a_free_instance_fails_instead_of_hanging(http_client):
    a = np.ones(4, dtype=np.float32)
    target = tensor("TARGET", np.array([b"bls_add_sub"], dtype=np.object_), "BYTES")
    start = time.time()
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("bls_add_sub", [tensor("INPUT0", a), tensor("INPUT1", a), target])
    assert time.time() - start < 10
    assert "bls_add_sub_0" in info.value.message()
    np.testing.assert_array_equal(
        http_client.infer("bls_add_sub", [tensor("INPUT0", a), tensor("INPUT1", a)]).as_numpy("OUTPUT0"), 2 * a
    )


def test_bls_timeout(http_client):
    # slow_add_sub takes 2 s; a 300 ms BLS timeout answers first, with an error.
    a = np.ones(4, dtype=np.float32)
    target = tensor("TARGET", np.array([b"slow_add_sub"], dtype=np.object_), "BYTES")
    timeout = tensor("TIMEOUT_US", np.array([300_000], dtype=np.int64))
    start = time.time()
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("bls_add_sub", [tensor("INPUT0", a), tensor("INPUT1", a), target, timeout])
    assert time.time() - start < 1.8
    assert "Request timeout expired" in info.value.message()


def test_bls_async_exec_gathers_two_models(http_client):
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    result = http_client.infer("bls_async", [tensor("INPUT0", x)])
    np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * x)
    np.testing.assert_array_equal(result.as_numpy("ECHO"), x)


def test_async_execute_overlaps_requests_on_one_instance(server):
    client = httpclient.InferenceServerClient(server.url, concurrency=8)
    try:
        start = time.time()
        pending = [
            client.async_infer("async_sleeper", [tensor("DELAY_MS", np.array([500], np.int32))]) for _ in range(8)
        ]
        for p in pending:
            assert p.get_result().as_numpy("DELAY_MS_OUT")[0] == 500
        elapsed = time.time() - start
    finally:
        client.close()
    # Eight 0.5 s requests one after another would take 4 s.
    assert elapsed < 2.5, elapsed


def test_default_mode_model_may_answer_through_the_sender(http_client):
    data = np.array([1, 2, 3], np.int32)
    result = http_client.infer("sender_default", [tensor("INPUT", data)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), 2 * data)


def test_parameters_reach_the_model_and_come_back(http_client):
    result = http_client.infer(
        "params_echo",
        [tensor("INPUT", np.array([1], np.int32))],
        parameters={"temperature": "hot", "max_tokens": 7, "stream": True},
    )
    seen = json.loads(result.as_numpy("PARAMS_JSON")[0])
    assert seen == {"temperature": "hot", "max_tokens": 7, "stream": True}
    response_params = result.get_response()["parameters"]
    assert response_params["echoed_by"] == "params_echo"
    assert response_params["max_tokens"] == 7


def test_client_disconnect_cancels_the_request(server):
    client = httpclient.InferenceServerClient(server.url, network_timeout=1.0, connection_timeout=1.0)
    tag = f"disconnect-{time.time()}"
    with pytest.raises(Exception):
        client.infer("cancel_watcher", [tensor("TAG", np.array([tag.encode()], dtype=np.object_), "BYTES")])
    client.close()
    deadline = time.time() + 10
    while time.time() < deadline and f"cancel_watcher saw cancellation of {tag}" not in server.log():
        time.sleep(0.1)
    assert f"cancel_watcher saw cancellation of {tag}" in server.log()


def test_logger_lines_reach_the_server_log_with_source_location(http_client, server):
    http_client.infer("logger_model", [tensor("INPUT", np.array([1], np.int32))])
    deadline = time.time() + 5
    while time.time() < deadline and "logger_model error line" not in server.log():
        time.sleep(0.05)
    lines = server.log().splitlines()
    info = next(l for l in lines if "logger_model info line" in l)
    assert info.startswith("I") and "model.py:" in info
    assert next(l for l in lines if "logger_model warning line" in l).startswith("W")
    assert next(l for l in lines if "logger_model error line" in l).startswith("E")
    assert any("logger_model default-level line" in l for l in lines)
    # the server runs with --log-verbose 0, so verbose lines are dropped
    assert not any("logger_model verbose line" in l for l in lines)


def test_is_ready_drives_model_readiness(http_client):
    assert http_client.is_model_ready("ready_toggle")
    http_client.infer("ready_toggle", [tensor("READY", np.array([False]))])
    assert not http_client.is_model_ready("ready_toggle")
    result = http_client.infer("ready_toggle", [tensor("READY", np.array([True]))])
    assert not result.as_numpy("WAS")[0]
    assert http_client.is_model_ready("ready_toggle")
