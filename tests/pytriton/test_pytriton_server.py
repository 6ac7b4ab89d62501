"""The PyTriton-style example programs (model_repo_examples/pytriton_*.py), run as subprocesses
and called with tritonclient (HTTP and gRPC) and kernel.client, as a user would."""

from __future__ import annotations

import os
import queue
import signal

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from kernel.client import DecoupledModelClient, ModelClient
from pytriton_examples import running


@pytest.fixture(scope="module")
def add_sub():
    yield from running("pytriton_add_sub.py", ["AddSub"])


@pytest.fixture(scope="module")
def identity():
    yield from running("pytriton_identity.py", ["Identity"])


@pytest.fixture(scope="module")
def optional():
    yield from running("pytriton_optional.py", ["Scale"])


@pytest.fixture(scope="module")
def decoupled():
    yield from running("pytriton_decoupled.py", ["Countdown"])


@pytest.fixture(scope="module")
def parameters():
    yield from running("pytriton_parameters.py", ["Affine"])


@pytest.fixture(scope="module")
def multiple():
    yield from running("pytriton_multiple_models.py", ["Square", "Negate", "Describe"])


def http_input(name, array, datatype=None):
    t = httpclient.InferInput(name, list(array.shape), datatype or _datatype(array))
    t.set_data_from_numpy(array)
    return t


def grpc_input(name, array, datatype=None):
    t = grpcclient.InferInput(name, list(array.shape), datatype or _datatype(array))
    t.set_data_from_numpy(array)
    return t


def _datatype(array):
    return {"f": "FP32" if array.dtype == np.float32 else "FP64", "i": "INT32" if array.dtype == np.int32 else "INT64",
            "O": "BYTES"}[array.dtype.kind]


# ---- add_sub: @batch over the dynamic batcher -------------------------------------------------


def test_add_sub_http_and_grpc(add_sub):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 0.5, np.float32)
    with httpclient.InferenceServerClient(add_sub.url) as client:
        result = client.infer("AddSub", [http_input("a", a), http_input("b", b)])
    np.testing.assert_array_equal(result.as_numpy("add"), a + b)
    np.testing.assert_array_equal(result.as_numpy("sub"), a - b)
    client = grpcclient.InferenceServerClient(add_sub.grpc_url)
    result = client.infer("AddSub", [grpc_input("a", a), grpc_input("b", b)],
                          outputs=[grpcclient.InferRequestedOutput("sub")])
    np.testing.assert_array_equal(result.as_numpy("sub"), a - b)
    assert result.as_numpy("add") is None  # only the requested output comes back
    client.close()


def test_add_sub_config_is_pytriton_shaped(add_sub):
    with httpclient.InferenceServerClient(add_sub.url) as client:
        config = client.get_model_config("AddSub")
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 64
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 200
    assert config["dynamic_batching"]["preferred_batch_size"] == [64]
    assert config["instance_group"][0]["name"] == "AddSub_0"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert [i["name"] for i in config["input"]] == ["a", "b"]
    assert config["input"][0]["data_type"] == "TYPE_FP32" and config["input"][0]["dims"] == [-1]
    assert "workspace-path" in config["parameters"]


def test_add_sub_concurrent_requests_are_batched_and_answered_each(add_sub):
    with httpclient.InferenceServerClient(add_sub.url, concurrency=16) as client:
        arrays = [np.full((1, 4), i, np.float32) for i in range(48)]
        pending = [client.async_infer("AddSub", [http_input("a", x), http_input("b", x)]) for x in arrays]
        for x, p in zip(arrays, pending):
            np.testing.assert_array_equal(p.get_result().as_numpy("add"), x + x)


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_add_sub_with_model_client(add_sub, scheme):
    url = f"http://{add_sub.url}" if scheme == "http" else f"grpc://{add_sub.grpc_url}"
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    with ModelClient(url, "AddSub", init_timeout_s=30) as client:
        result = client.infer_batch(a=a, b=a)
        sample = client.infer_sample(np.array([5.0], np.float32), np.array([1.0], np.float32))
    np.testing.assert_array_equal(result["add"], a + a)
    np.testing.assert_array_equal(sample["sub"], [4.0])


def test_add_sub_bad_input_is_refused_and_server_keeps_serving(add_sub):
    with httpclient.InferenceServerClient(add_sub.url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("AddSub", [http_input("a", np.ones((1, 2), np.float64)),
                                    http_input("b", np.ones((1, 2), np.float32))])
        assert "data-type" in str(err.value) or "expects" in str(err.value)
        with pytest.raises(InferenceServerException) as err:  # a missing input, counted first as Triton does
            client.infer("AddSub", [http_input("a", np.ones((1, 2), np.float32))])
        assert "expected 2 inputs but got 1 inputs" in str(err.value)
        ok = client.infer("AddSub", [http_input("a", np.ones((1, 2), np.float32)),
                                     http_input("b", np.ones((1, 2), np.float32))])
        np.testing.assert_array_equal(ok.as_numpy("add"), [[2.0, 2.0]])


def test_add_sub_stops_on_ctrl_c():
    from pytriton_examples import ExampleProcess

    example = ExampleProcess("pytriton_add_sub.py", ["AddSub"]).wait_ready()
    assert example.wait_for_log("Serving until SIGINT")
    assert example.stop() == 0, example.log()
    assert "successfully unloaded 'AddSub'" in example.log()
    assert not any(p.name.startswith("workspace_") for p in os.scandir(example.home))  # workspace removed


def test_ctrl_c_while_starting_leaves_nothing_behind():
    # Ctrl-C as soon as the server answers at all: mid start-up (the program ends with
    # KeyboardInterrupt, as any Python program does there) or once serving (a clean exit).
    from pytriton_examples import ExampleProcess

    example = ExampleProcess("pytriton_add_sub.py", ["AddSub"]).wait_until_ok(["/v2/health/live"])
    code = example.stop()
    log = example.log()
    assert code == 0 or (code == -signal.SIGINT and log.rstrip().endswith("KeyboardInterrupt")), log
    assert not any(p.name.startswith("workspace_") for p in os.scandir(example.home))


# ---- identity: BYTES tensors ---------------------------------------------------------------------


def test_identity_bytes_round_trip(identity):
    text = np.array([[b"hello"], [b"\x00\xffbinary"], ["h\u00e9llo".encode()], [b""]], dtype=np.object_)
    with httpclient.InferenceServerClient(identity.url) as client:
        result = client.infer("Identity", [http_input("text", text)])
    assert result.as_numpy("text").tolist() == text.tolist()
    assert result.as_numpy("length").reshape(-1).tolist() == [5, 8, 6, 0]
    client = grpcclient.InferenceServerClient(identity.grpc_url)
    result = client.infer("Identity", [grpc_input("text", text)])
    assert result.as_numpy("text").tolist() == text.tolist()
    client.close()


def test_identity_with_model_client(identity):
    with ModelClient(f"grpc://{identity.grpc_url}", "Identity", init_timeout_s=30) as client:
        result = client.infer_sample(np.array([b"kernel"], dtype=np.object_))
    assert result["text"].tolist() == [b"kernel"]
    assert result["length"].tolist() == [6]


# ---- optional inputs with @fill_optionals ----------------------------------------------------------


def test_optional_inputs_take_defaults(optional):
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    with httpclient.InferenceServerClient(optional.url) as client:
        plain = client.infer("Scale", [http_input("x", x)])
        np.testing.assert_array_equal(plain.as_numpy("y"), x)
        both = client.infer("Scale", [http_input("x", x), http_input("scale", np.array([[2.0]], np.float32)),
                                      http_input("offset", np.array([[1.0]], np.float32))])
        np.testing.assert_array_equal(both.as_numpy("y"), x * 2 + 1)
        only_offset = client.infer("Scale", [http_input("x", x), http_input("offset", np.array([[-1.0]], np.float32))])
        np.testing.assert_array_equal(only_offset.as_numpy("y"), x - 1)


def test_optional_inputs_with_model_client(optional):
    x = np.array([[1.0, 2.0]], np.float32)
    with ModelClient(f"http://{optional.url}", "Scale", init_timeout_s=30) as client:
        np.testing.assert_array_equal(client.infer_batch(x=x)["y"], x)
        result = client.infer_batch(x=x, scale=np.array([[3.0]], np.float32))
    np.testing.assert_array_equal(result["y"], x * 3)


def test_optional_required_input_missing_is_refused(optional):
    with httpclient.InferenceServerClient(optional.url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("Scale", [http_input("scale", np.array([[2.0]], np.float32))])
        assert "missing required input" in str(err.value) and "'x'" in str(err.value)


# ---- decoupled: a generator streams responses over gRPC ---------------------------------------------


def test_decoupled_streams_each_yield_then_final(decoupled):
    responses = queue.Queue()
    client = grpcclient.InferenceServerClient(decoupled.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("Countdown", [grpc_input("start", np.array([3], np.int32))],
                                  request_id="r1", enable_empty_final_response=True)
        values, finals = [], []
        while True:
            result, error = responses.get(timeout=10)
            assert error is None, error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            finals.append(final)
            if response.outputs:
                values.append(int(result.as_numpy("value")[0]))
            if final:
                break
    finally:
        client.stop_stream()
        client.close()
    assert values == [3, 2, 1]
    assert finals == [False, False, False, True]


def test_decoupled_with_decoupled_model_client(decoupled):
    with DecoupledModelClient(f"grpc://{decoupled.grpc_url}", "Countdown", init_timeout_s=30) as client:
        values = [int(r["value"][0]) for r in client.infer_sample(np.array([4], np.int32))]
    assert values == [4, 3, 2, 1]


def test_decoupled_zero_responses_then_the_stream_goes_on(decoupled):
    responses = queue.Queue()
    client = grpcclient.InferenceServerClient(decoupled.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        # Counting down from 0 yields nothing: the request gets only the final flag.
        client.async_stream_infer("Countdown", [grpc_input("start", np.array([0], np.int32))],
                                  request_id="empty", enable_empty_final_response=True)
        result, error = responses.get(timeout=10)
        assert error is None
        assert result.get_response().parameters["triton_final_response"].bool_param
        client.async_stream_infer("Countdown", [grpc_input("start", np.array([1], np.int32))], request_id="one")
        result, error = responses.get(timeout=10)
        assert error is None and int(result.as_numpy("value")[0]) == 1
    finally:
        client.stop_stream()
        client.close()


def test_decoupled_over_http_is_an_error(decoupled):
    with httpclient.InferenceServerClient(decoupled.url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("Countdown", [http_input("start", np.array([2], np.int32))])
    assert "decoupled" in str(err.value)


# ---- parameters and forwarded headers ----------------------------------------------------------------


def test_parameters_and_headers_reach_the_callable(parameters):
    x = np.array([[1.0, 2.0]], np.float32)
    with httpclient.InferenceServerClient(parameters.url) as client:
        result = client.infer("Affine", [http_input("x", x)], parameters={"factor": 3}, headers={"x-bias": "0.5"})
        np.testing.assert_allclose(result.as_numpy("y"), x * 3 + 0.5)
        plain = client.infer("Affine", [http_input("x", x)], headers={"other": "7"})  # not forwarded
        np.testing.assert_allclose(plain.as_numpy("y"), x)
    client = grpcclient.InferenceServerClient(parameters.grpc_url)
    result = client.infer("Affine", [grpc_input("x", x)], parameters={"factor": 2})
    np.testing.assert_allclose(result.as_numpy("y"), x * 2)
    result = client.infer("Affine", [grpc_input("x", x)], parameters={"factor": 2}, headers={"x-bias": "0.25"})
    np.testing.assert_allclose(result.as_numpy("y"), x * 2 + 0.25)  # TritonConfig.grpc_header_forward_pattern
    client.close()


def test_parameters_with_model_client(parameters):
    x = np.array([[1.0, 2.0]], np.float32)
    with ModelClient(f"http://{parameters.url}", "Affine", init_timeout_s=30) as client:
        result = client.infer_batch(x, parameters={"factor": 10}, headers={"x-bias": "1"})
    np.testing.assert_allclose(result["y"], x * 10 + 1)


def test_reserved_header_name_is_refused(parameters):
    with httpclient.InferenceServerClient(parameters.url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("Affine", [http_input("x", np.ones((1, 1), np.float32))], headers={"x-ok": "1",
                                                                                           "triton_x-y": "1"})
    assert "reserved" in str(err.value)


# ---- several models in one Triton ---------------------------------------------------------------------


def test_multiple_models_each_answer(multiple):
    x = np.array([[1.0, -2.0]], np.float32)
    with httpclient.InferenceServerClient(multiple.url) as client:
        np.testing.assert_array_equal(client.infer("Square", [http_input("x", x)]).as_numpy("y"), x * x)
        np.testing.assert_array_equal(client.infer("Negate", [http_input("x", x)]).as_numpy("y"), -x)
        described = client.infer("Describe", [http_input("x", np.array([1.0, 2.0], np.float32))])
        assert described.as_numpy("mean").tolist() == [1.5]
        assert described.as_numpy("label").tolist() == [b"positive"]
        config = client.get_model_config("Negate")
        assert config["instance_group"][0]["count"] == 2
        assert client.get_model_config("Describe")["max_batch_size"] == 0


def test_multiple_models_with_model_clients(multiple):
    x = np.array([[3.0]], np.float32)
    with ModelClient(f"grpc://{multiple.grpc_url}", "Square", init_timeout_s=30) as square, \
            ModelClient(f"grpc://{multiple.grpc_url}", "Negate", init_timeout_s=30) as negate:
        assert square.infer_batch(x)["y"].tolist() == [[9.0]]
        assert negate.infer_batch(x)["y"].tolist() == [[-3.0]]


def test_multiple_models_unknown_model_is_not_found(multiple):
    with httpclient.InferenceServerClient(multiple.url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("Cube", [http_input("x", np.ones((1, 1), np.float32))])
    assert "Cube" in str(err.value)
