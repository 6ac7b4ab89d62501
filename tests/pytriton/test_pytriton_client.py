"""kernel.client.ModelClient and FuturesModelClient (PyTriton's client API) against a real `kernel serve`."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future

import numpy as np
import pytest

from kernel.client import FuturesModelClient, ModelClient
from kernel.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientError,
    PyTritonClientInferenceServerError,
    PyTritonClientInvalidUrlError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientModelUnavailableError,
    PyTritonClientQueueFullError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from kernel.client.url import TritonUrl
from conftest import EXAMPLES, free_port

A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
B = np.array([0.5, 0.5, 0.5, 0.5], np.float32)


def assert_add_sub(result):
    assert set(result) == {"OUTPUT0", "OUTPUT1"}
    np.testing.assert_array_equal(result["OUTPUT0"], A + B)
    np.testing.assert_array_equal(result["OUTPUT1"], A - B)
    assert result["OUTPUT0"].dtype == np.float32


# ---- inference ------------------------------------------------------------------------------


def test_positional_inputs_follow_config_order(url):
    with ModelClient(url, "add_sub") as client:
        assert_add_sub(client.infer_sample(A, B))


def test_named_inputs(url):
    with ModelClient(url, "add_sub") as client:
        assert_add_sub(client.infer_sample(INPUT1=B, INPUT0=A))


def test_sample_on_batching_model_adds_and_strips_batch_axis(url):
    with ModelClient(url, "auto_add") as client:
        result = client.infer_sample(np.array([1, 2, 3], np.int32), np.array([10, 20, 30], np.int32))
    assert result["SUM"].shape == (3,)
    assert result["SUM"].tolist() == [11, 22, 33]


def test_batch_on_batching_model_keeps_batch_axis(url):
    with ModelClient(url, "auto_add") as client:
        a = np.array([[1, 2], [3, 4]], np.int32)
        result = client.infer_batch(A=a, B=a)
    assert result["SUM"].shape == (2, 2)
    assert result["SUM"].tolist() == [[2, 4], [6, 8]]


def test_bytes_outputs_are_object_arrays_of_bytes(url):
    with ModelClient(url, "string_identity") as client:
        sample = client.infer_sample(np.array([b"abc", b"", "é".encode()], dtype=object))
        batch = client.infer_batch(np.array([[b"x"], [b"yz"]], dtype=np.bytes_))
    assert sample["OUTPUT0"].dtype == np.object_
    assert sample["OUTPUT0"].tolist() == [b"abc", b"", "é".encode()]
    assert batch["OUTPUT0"].shape == (2, 1)
    assert batch["OUTPUT0"].tolist() == [[b"x"], [b"yz"]]


def test_infer_batch_on_non_batching_model(url):
    with ModelClient(url, "add_sub") as client:
        with pytest.raises(PyTritonClientModelDoesntSupportBatchingError, match="add_sub"):
            client.infer_batch(A[None], B[None])
        assert client.is_batching_supported is False


def test_parameters_reach_the_model(url):
    with ModelClient(url, "params_echo") as client:
        result = client.infer_sample(
            np.array([1], np.int32), parameters={"temperature": "hot", "count": 3, "flag": True}
        )
    seen = json.loads(result["PARAMS_JSON"][0])
    assert seen == {"temperature": "hot", "count": 3, "flag": True}


def test_model_config(url):
    with ModelClient(url, "add_sub") as client:
        config = client.model_config
    assert config.model_name == "add_sub"
    assert config.max_batch_size == 0 and config.batching is False and config.decoupled is False
    assert [(t.name, t.shape, t.dtype) for t in config.inputs] == [
        ("INPUT0", (4,), np.float32), ("INPUT1", (4,), np.float32)
    ]
    assert [t.name for t in config.outputs] == ["OUTPUT0", "OUTPUT1"]
    with ModelClient(url, "string_identity") as client:
        config = client.model_config
    assert config.max_batch_size == 8 and config.batching is True
    assert config.inputs[0].dtype is np.bytes_ and config.inputs[0].shape == (-1,)
    with ModelClient(url, "repeat_int32") as client:
        assert client.model_config.decoupled is True


def test_model_version(url):
    with ModelClient(url, "add_sub", "1") as client:
        assert_add_sub(client.infer_sample(A, B))
    with ModelClient(url, "add_sub", "7", init_timeout_s=0.5) as client:
        with pytest.raises(PyTritonClientModelUnavailableError, match="add_sub version 7"):
            client.infer_sample(A, B)


def test_from_existing_client(url):
    with ModelClient(url, "add_sub") as first:
        first.infer_sample(A, B)
        with ModelClient.from_existing_client(first) as second:
            assert second.model_config is first.model_config
            assert_add_sub(second.infer_sample(A, B))


# ---- errors ---------------------------------------------------------------------------------


def test_bad_arguments_are_value_errors_and_server_keeps_serving(url):
    with ModelClient(url, "add_sub") as client:
        bad_calls = [
            lambda: client.infer_sample(),
            lambda: client.infer_sample(A, INPUT1=B),
            lambda: client.infer_sample(A, B, A),
            lambda: client.infer_sample(A, [0.5, 0.5, 0.5, 0.5]),
            lambda: client.infer_sample(A, np.array(["a", "b", "c", "d"])),
            lambda: client.infer_sample(A, B, parameters=["not", "a", "dict"]),
            lambda: client.infer_sample(A, B, parameters={"x": [1, 2]}),
            lambda: client.infer_sample(A, B, headers={1: "x"}),
        ]
        for call in bad_calls:
            with pytest.raises(PyTritonClientValueError):
                call()
        assert_add_sub(client.infer_sample(A, B))


def test_model_error_is_inference_server_error_with_its_message(url):
    with ModelClient(url, "raises") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="this model always fails"):
            client.infer_sample(A)
    with ModelClient(url, "error_response") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="the model refused this request"):
            client.infer_sample(A)
    with ModelClient(url, "add_sub") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="INPUT0"):
            client.infer_sample(INPUT0=A[:2], INPUT1=B)  # wrong shape: the server says which input
        assert_add_sub(client.infer_sample(A, B))


def test_coupled_client_refuses_decoupled_model(url):
    with ModelClient(url, "repeat_int32") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="decoupled"):
            client.infer_sample(np.array([1], np.int32))


def test_inference_timeout(url):
    with ModelClient(url, "slow_add_sub", inference_timeout_s=0.5) as client:
        start = time.monotonic()
        with pytest.raises(PyTritonClientTimeoutError):
            client.infer_sample(A, B)
        assert time.monotonic() - start < 1.8  # the model takes 2 s
    with ModelClient(url, "slow_add_sub", inference_timeout_s=30) as client:
        assert client.infer_sample(A, B)["OUTPUT0"].tolist() == (A + B).tolist()


def test_unknown_model(url):
    with ModelClient(url, "no_such_model", init_timeout_s=0.5) as client:
        with pytest.raises(PyTritonClientModelUnavailableError, match="no_such_model") as info:
            client.infer_sample(A)
        assert "no_such_model" in info.value.message
        with pytest.raises(PyTritonClientModelUnavailableError):
            client.wait_for_model(0.3)


def test_unreachable_server_times_out():
    url = f"grpc://127.0.0.1:{free_port()}"
    for target in (url, url.replace("grpc://", "http://")):
        start = time.monotonic()
        with ModelClient(target, "add_sub", init_timeout_s=0.5) as client:
            with pytest.raises(PyTritonClientTimeoutError):
                client.infer_sample(A, B)
        assert time.monotonic() - start < 5


def test_closed_client(url):
    client = ModelClient(url, "add_sub")
    assert_add_sub(client.infer_sample(A, B))
    client.close()
    client.close()  # closing twice is harmless
    for call in (lambda: client.infer_sample(A, B), lambda: client.infer_batch(A, B),
                 lambda: client.model_config, lambda: client.wait_for_model(1)):
        with pytest.raises(PyTritonClientClosedError):
            call()
    with ModelClient(url, "add_sub") as client:
        pass
    with pytest.raises(PyTritonClientClosedError):
        client.infer_sample(A, B)


def test_every_error_is_a_client_error_with_message():
    for cls in (PyTritonClientClosedError, PyTritonClientTimeoutError, PyTritonClientInvalidUrlError,
                PyTritonClientModelUnavailableError, PyTritonClientQueueFullError):
        err = cls("text")
        assert isinstance(err, PyTritonClientError) and err.message == "text" and str(err) == "text"
    assert issubclass(PyTritonClientInvalidUrlError, PyTritonClientValueError)


# ---- initialisation and readiness -------------------------------------------------------------


def test_lazy_init_false_checks_the_model_at_construction(url):
    with ModelClient(url, "add_sub", lazy_init=False) as client:
        assert client.model_config.model_name == "add_sub"
        assert_add_sub(client.infer_sample(A, B))
    with pytest.raises(PyTritonClientModelUnavailableError):
        ModelClient(url, "no_such_model", lazy_init=False, init_timeout_s=0.5)
    ModelClient(url, "no_such_model", init_timeout_s=0.5).close()  # lazy: nothing asked yet


def test_wait_for_model(url):
    with ModelClient(url, "add_sub") as client:
        client.wait_for_model(5)
        client.wait_for_server(5)


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_wait_for_model_while_the_server_starts(start_kernel, scheme):
    kernel = start_kernel([EXAMPLES])  # not waited for: the client does the waiting
    url = f"http://{kernel.url}" if scheme == "http" else f"grpc://{kernel.grpc_url}"
    with ModelClient(url, "add_sub", init_timeout_s=60) as client:
        client.wait_for_model(60)
        assert_add_sub(client.infer_sample(A, B))


# ---- urls -----------------------------------------------------------------------------------


def test_url_forms(server):
    port = server.url.split(":")[1]
    for url in (f"localhost:{port}", f"http://localhost:{port}", f"127.0.0.1:{port}", f"HTTP://localhost:{port}/"):
        with ModelClient(url, "add_sub") as client:
            assert_add_sub(client.infer_sample(A, B))
    with ModelClient(f"grpc://{server.grpc_url}", "add_sub") as client:
        assert_add_sub(client.infer_sample(A, B))


def test_url_defaults():
    assert TritonUrl.from_url("localhost") == TritonUrl("http", "localhost", 8000)
    assert TritonUrl.from_url("http://example.com") == TritonUrl("http", "example.com", 8000)
    assert TritonUrl.from_url("grpc://example.com") == TritonUrl("grpc", "example.com", 8001)
    assert TritonUrl.from_url("grpc://[::1]:9001").without_scheme == "[::1]:9001"


@pytest.mark.parametrize("bad", ["", "ftp://localhost:8000", "https://localhost", "http://localhost:notaport",
                                 "grpc://localhost:99999", "http://:8000", None, 8000])
def test_invalid_url(bad):
    with pytest.raises(PyTritonClientInvalidUrlError):
        ModelClient(bad, "add_sub")
    with pytest.raises(PyTritonClientInvalidUrlError):
        FuturesModelClient(bad, "add_sub")


# ---- FuturesModelClient ---------------------------------------------------------------------


def test_futures_client(url):
    with FuturesModelClient(url, "add_sub", max_workers=4) as client:
        futures = [client.infer_sample(A, B * i) for i in range(12)]
        assert all(isinstance(f, Future) for f in futures)
        for i, future in enumerate(futures):
            np.testing.assert_array_equal(future.result(timeout=30)["OUTPUT0"], A + B * i)
        assert client.model_config().result(timeout=30).model_name == "add_sub"
        assert client.wait_for_model(5).result(timeout=30) is None
        failed = client.infer_batch(A[None], B[None])
        assert isinstance(failed.exception(timeout=30), PyTritonClientModelDoesntSupportBatchingError)
    with FuturesModelClient(url, "auto_add") as client:
        a = np.array([[1, 2], [3, 4]], np.int32)
        assert client.infer_batch(A=a, B=a).result(timeout=30)["SUM"].tolist() == [[2, 4], [6, 8]]
        assert client.infer_sample(A=a[0], B=a[1]).result(timeout=30)["SUM"].tolist() == [4, 6]


def test_futures_client_errors_and_parameters(url):
    with FuturesModelClient(url, "raises") as client:
        error = client.infer_sample(A).exception(timeout=30)
        assert isinstance(error, PyTritonClientInferenceServerError) and "this model always fails" in error.message
    with FuturesModelClient(url, "params_echo") as client:
        result = client.infer_sample(np.array([1], np.int32), parameters={"k": "v"}).result(timeout=30)
        assert json.loads(result["PARAMS_JSON"][0]) == {"k": "v"}
    with FuturesModelClient(url, "no_such_model", init_timeout_s=0.5) as client:
        assert isinstance(client.infer_sample(A).exception(timeout=30), PyTritonClientModelUnavailableError)


def test_futures_client_closed(url):
    client = FuturesModelClient(url, "add_sub")
    pending = client.infer_sample(A, B)
    client.close()  # waits for queued calls
    assert_add_sub(pending.result(timeout=0))
    with pytest.raises(PyTritonClientClosedError):
        client.infer_sample(A, B)
    with pytest.raises(PyTritonClientClosedError):
        client.model_config()


def test_futures_client_queue_full(url):
    with FuturesModelClient(url, "slow_add_sub", max_workers=1, max_queue_size=1, non_blocking=True) as client:
        accepted = []
        with pytest.raises(PyTritonClientQueueFullError):
            for _ in range(3):  # one runs, one waits, the next finds the queue full
                accepted.append(client.infer_sample(A, B))
        assert 1 <= len(accepted) <= 2
        for future in accepted:
            assert_add_sub(future.result(timeout=30))


def test_futures_client_rejects_bad_pool_sizes(server):
    for kwargs in ({"max_workers": 0}, {"max_queue_size": -1}):
        with pytest.raises(PyTritonClientValueError):
            FuturesModelClient(server.url, "add_sub", **kwargs)
