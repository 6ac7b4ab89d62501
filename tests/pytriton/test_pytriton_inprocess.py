"""kernel.triton.Triton used in-process, as a PyTriton program uses it: bind, run, call with real
clients, stop. Covers errors from callables, strict output checks, bind-time validation,
TritonConfig.from_env, the security config and the Vertex AI endpoint."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import free_ports
from kernel.client import ModelClient
from kernel.decorators import batch, triton_context
from kernel.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonRuntimeError,
    PyTritonUnrecoverableError,
    PyTritonValidationError,
)
from kernel.model_config import ModelConfig, Tensor
from kernel.triton import Triton, TritonConfig, TritonLifecyclePolicy, TritonSecurityConfig

VEC = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
OUT = [Tensor(name="y", dtype=np.float32, shape=(-1,))]


def workspace() -> Path:
    return Path(tempfile.mkdtemp(prefix="pytriton-inproc-")) / "ws"


def config(**extra) -> TritonConfig:
    http, grpc, metrics = free_ports(3)
    return TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics, **extra)


def infer(client, model, x, **kwargs):
    t = httpclient.InferInput("x", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    return client.infer(model, [t], **kwargs)


# ---- callables used by the shared server ---------------------------------------------------------

def raises_on_negative(requests):
    for r in requests:
        if (r["x"] < 0).any():
            raise ValueError("negative input is not allowed")
    return [{"y": r["x"] * 2} for r in requests]


def wrong_count(requests):
    return [{"y": r["x"]} for r in requests] + [{"y": requests[0]["x"]}]


def not_a_list(requests):
    return {"y": requests[0]["x"]}


def loose(requests):  # extra output (dropped) and int64 data (cast to the declared FP32)
    return [{"y": r["x"].astype(np.int64), "extra": r["x"]} for r in requests]


def wrong_dtype(requests):
    return [{"y": r["x"].astype(np.int64)} for r in requests]


def undeclared(requests):
    return [{"y": r["x"], "z": r["x"]} for r in requests]


def missing(requests):
    return [{} for _ in requests]


def str_objects(requests):
    return [{"y": np.array(["a"] * r["x"].size, dtype=object)} for r in requests]


def wrong_shape(requests):
    return [{"y": r["x"].reshape(-1, 1, 1)} for r in requests]


threads_seen = []


def slow(requests):
    threads_seen.append(threading.current_thread().name)
    time.sleep(0.5)
    return [{"y": r["x"]} for r in requests]


async def async_sleeper(requests):
    await asyncio.sleep(0.3)
    return [{"y": r["x"] + 1} for r in requests]


@triton_context
def context_reader(requests, triton_context):
    model_config = triton_context.model_configs[context_reader]
    return [{"y": np.full(r["x"].shape, model_config.max_batch_size, np.float32)} for r in requests]


@batch
def doubled(x):
    return {"y": x * 2}


def writes_input(requests):
    for r in requests:
        r["x"] += 1  # inputs are writable numpy arrays
    return [{"y": r["x"]} for r in requests]


@pytest.fixture(scope="module")
def triton():
    with Triton(config=config(), workspace=workspace(),
                security_config=TritonSecurityConfig(restricted_endpoints=[])) as t:
        t.bind("raises", raises_on_negative, VEC, OUT)
        t.bind("wrong_count", wrong_count, VEC, OUT)
        t.bind("not_a_list", not_a_list, VEC, OUT)
        t.bind("loose", loose, VEC, OUT)
        t.bind("strict_dtype", wrong_dtype, VEC, OUT, strict=True)
        t.bind("strict_undeclared", undeclared, VEC, OUT, strict=True)
        t.bind("strict_missing", missing, VEC, OUT, strict=True)
        t.bind("strict_shape", wrong_shape, VEC, OUT, strict=True)
        t.bind("missing", missing, VEC, OUT)
        t.bind("str_objects", str_objects, VEC, OUT)
        t.bind("slow", slow, VEC, OUT, config=ModelConfig(batching=False))
        t.bind("async_sleeper", async_sleeper, VEC, OUT, config=ModelConfig(batching=False))
        t.bind("context", context_reader, VEC, OUT, config=ModelConfig(max_batch_size=7))
        t.bind("doubled", doubled, VEC, OUT, config=ModelConfig(max_batch_size=16))
        t.bind("writes_input", writes_input, VEC, OUT)
        t.run()
        yield t


@pytest.fixture
def client(triton):
    with httpclient.InferenceServerClient(f"localhost:{triton._config.http_port}", concurrency=8) as c:
        yield c


X = np.array([[1.0, 2.0]], np.float32)


def failure(client, model, x=X) -> str:
    with pytest.raises(InferenceServerException) as err:
        infer(client, model, x)
    assert err.value.status() == "500"
    return str(err.value)


# ---- serving ---------------------------------------------------------------------------------------


def test_callable_error_reaches_the_client_and_next_request_works(client):
    message = failure(client, "raises", -X)
    assert "Failed to process the request(s) for model 'raises_0_0'" in message
    assert "ValueError: negative input is not allowed" in message
    assert "raises_on_negative" in message  # the callable's traceback, as PyTriton reports it
    np.testing.assert_array_equal(infer(client, "raises", X).as_numpy("y"), X * 2)


def test_wrong_number_of_results_is_an_error(client):
    assert "returned 2 responses for 1 requests" in failure(client, "wrong_count")


def test_result_that_is_not_a_list_is_an_error(client):
    assert "must return a list" in failure(client, "not_a_list")


def test_non_strict_drops_undeclared_outputs_and_casts_to_declared_dtype(client):
    result = infer(client, "loose", np.array([[1.7, 2.0]], np.float32))
    assert result.as_numpy("extra") is None
    y = result.as_numpy("y")
    assert y.dtype == np.float32 and y.tolist() == [[1.0, 2.0]]


def test_strict_wrong_dtype_is_an_error(client):
    message = failure(client, "strict_dtype")
    assert "output 'y' of model 'strict_dtype' has dtype int64" in message and "float32" in message


def test_strict_undeclared_output_is_an_error(client):
    assert "output 'z' returned by model 'strict_undeclared' is not declared" in failure(client, "strict_undeclared")


def test_strict_missing_output_is_an_error(client):
    assert "did not return output(s) 'y'" in failure(client, "strict_missing")


def test_strict_wrong_shape_is_an_error(client):
    assert "has shape [1, 1] after the batch dimension; the model declares [-1]" in failure(client, "strict_shape")


def test_non_strict_missing_output_gives_a_response_without_it(client):
    result = infer(client, "missing", X)
    assert result.get_response().get("outputs", []) == []
    assert result.as_numpy("y") is None


def test_object_array_of_str_is_an_error(client):
    assert "object array of str" in failure(client, "str_objects")


def test_sync_callable_runs_off_the_server_loop(triton, client):
    pending = client.async_infer("slow", [_input(np.array([1.0], np.float32))])
    time.sleep(0.1)
    started = time.monotonic()
    assert client.is_server_live() and client.is_model_ready("raises")  # the loop answers meanwhile
    assert time.monotonic() - started < 0.3
    assert pending.get_result().as_numpy("y").tolist() == [1.0]
    assert threads_seen and all(name == "kernel-slow_0_0" for name in threads_seen)


def test_async_callable_requests_overlap(client):
    started = time.monotonic()
    pending = [client.async_infer("async_sleeper", [_input(np.array([float(i)], np.float32))]) for i in range(4)]
    assert [p.get_result().as_numpy("y").tolist() for p in pending] == [[1.0], [2.0], [3.0], [4.0]]
    assert time.monotonic() - started < 1.0  # four 0.3 s awaits, run concurrently


def test_decorators_see_the_bound_model_config(client):
    assert infer(client, "context", X).as_numpy("y").tolist() == [[7.0, 7.0]]


def test_callable_may_write_to_its_inputs(client):
    assert infer(client, "writes_input", X).as_numpy("y").tolist() == [[2.0, 3.0]]


def test_statistics_count_batched_requests(triton, client):
    pending = [client.async_infer("doubled", [_input(np.full((1, 3), i, np.float32))]) for i in range(20)]
    for i, p in enumerate(pending):
        assert p.get_result().as_numpy("y").tolist() == [[2.0 * i] * 3]
    stats = client.get_inference_statistics("doubled")["model_stats"][0]
    assert stats["inference_count"] == 20
    assert 1 <= stats["execution_count"] <= 20
    assert stats["inference_stats"]["success"]["count"] == 20


def test_model_client_against_in_process_server(triton):
    with ModelClient(f"localhost:{triton._config.http_port}", "doubled", init_timeout_s=30) as c:
        assert c.infer_batch(X)["y"].tolist() == [[2.0, 4.0]]


def test_bind_after_run_loads_at_once_and_bad_model_leaves_nothing_behind(triton, client):
    with pytest.raises(PyTritonModelConfigError) as err:
        triton.bind("late", doubled, [Tensor(name="x", dtype=np.float32, shape=())], OUT)
    assert "dims" in str(err.value)
    assert not client.is_model_ready("late")
    triton.bind("late", doubled, VEC, OUT)  # the name is free again
    assert client.is_model_ready("late")
    assert infer(client, "late", X).as_numpy("y").tolist() == [[2.0, 4.0]]


def _input(x):
    t = httpclient.InferInput("x", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    return t


# ---- bind-time validation ---------------------------------------------------------------------------


@pytest.fixture
def unstarted():
    t = Triton(config=config(), workspace=workspace())
    yield t
    t.stop()


def test_bind_validation_errors(unstarted):
    with pytest.raises(PyTritonValidationError):
        unstarted.bind("", doubled, VEC, OUT)
    with pytest.raises(PyTritonValidationError):
        unstarted.bind("bad/name", doubled, VEC, OUT)
    with pytest.raises(PyTritonValidationError):
        unstarted.bind("m", "not callable", VEC, OUT)
    with pytest.raises(PyTritonValidationError):
        unstarted.bind("m", doubled, VEC, [Tensor(name="y", dtype=np.float32, shape=(-1,), optional=True)])
    with pytest.raises(PyTritonBadParameterError):
        unstarted.bind("m", doubled, [Tensor(name="x", dtype=np.complex64, shape=(-1,))], OUT)
    with pytest.raises(PyTritonBadParameterError):
        unstarted.bind("m", doubled, VEC, OUT, config=ModelConfig(max_batch_size=0))
    unstarted.bind("m", doubled, VEC, OUT)
    with pytest.raises(PyTritonInvalidOperationError):
        unstarted.bind("M", doubled, VEC, OUT)  # names are compared case-insensitively, as in PyTriton


def test_default_tensor_names_and_generated_config(unstarted):
    unstarted.bind("named", lambda requests: requests, [Tensor(dtype=np.int32, shape=(2,)), Tensor(dtype=bytes, shape=(1,))],
                   [Tensor(dtype=np.float64, shape=(-1, 3))], config=ModelConfig(batching=False, decoupled=True))
    text = (unstarted._workspace.model_store_path / "named" / "config.pbtxt").read_text()
    assert 'name: "INPUT_1"' in text and 'name: "INPUT_2"' in text and 'name: "OUTPUT_1"' in text
    assert "TYPE_STRING" in text and "max_batch_size: 0" in text and "decoupled: true" in text
    assert (unstarted._workspace.model_store_path / "named" / "1").is_dir()


def test_both_endpoints_off_is_refused():
    with pytest.raises(PyTritonValidationError):
        TritonConfig(allow_http=False, allow_grpc=False)


# ---- lifecycle ---------------------------------------------------------------------------------------------


def test_stop_removes_workspace_and_frees_the_ports():
    cfg = config()
    ws = workspace()
    t = Triton(config=cfg, workspace=ws, security_config=TritonSecurityConfig(restricted_endpoints=[]))
    t.bind("doubled", doubled, VEC, OUT)
    t.run()
    assert t.is_alive() and t.is_connected()
    assert ws.exists()
    assert t.stop() is True
    assert not t.is_alive() and not ws.exists()
    assert t.stop() is False
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://localhost:{cfg.http_port}/v2/health/live", timeout=1)


def test_unrecoverable_error_stops_serve():
    def fatal(requests):
        raise PyTritonUnrecoverableError("the device is gone")

    cfg = config()
    t = Triton(config=cfg, workspace=workspace())
    t.bind("fatal", fatal, VEC, OUT)
    serving = threading.Thread(target=t.serve, kwargs={"monitoring_period_s": 0.1})
    serving.start()
    url = f"localhost:{cfg.http_port}"
    deadline = time.time() + 30
    while time.time() < deadline and not t.is_connected():
        time.sleep(0.05)
    with httpclient.InferenceServerClient(url) as c:
        with pytest.raises(InferenceServerException) as err:
            infer(c, "fatal", X)
    assert "the device is gone" in str(err.value)
    serving.join(30)
    assert not serving.is_alive() and not t.is_alive()


def test_address_in_use_is_a_clear_error():
    cfg = config()
    with Triton(config=cfg, workspace=workspace()) as first:
        first.bind("doubled", doubled, VEC, OUT)
        second_workspace = workspace()
        with pytest.raises(PyTritonRuntimeError) as err:
            with Triton(config=cfg, workspace=second_workspace):
                pass
        assert f"could not listen on 0.0.0.0:{cfg.http_port}" in str(err.value)
        assert not second_workspace.exists()  # a failed start leaves no workspace behind
        with httpclient.InferenceServerClient(f"localhost:{cfg.http_port}") as c:  # the first one serves on
            assert infer(c, "doubled", X).as_numpy("y").tolist() == [[2.0, 4.0]]


def test_model_bound_before_start_that_cannot_load_fails_run():
    t = Triton(config=config(), workspace=workspace(), triton_lifecycle_policy=TritonLifecyclePolicy(
        launch_triton_on_startup=False))
    t.bind("scalar", doubled, [Tensor(name="x", dtype=np.float32, shape=())], OUT)
    with pytest.raises(PyTritonModelConfigError) as err:
        t.run()
    assert "model 'scalar'" in str(err.value) and "dims" in str(err.value)
    assert not t.is_alive()
    assert t.stop() is False  # it never ran; its workspace goes all the same
    assert not t._workspace.exists()


def test_bad_option_values_are_validation_errors():
    with pytest.raises(PyTritonValidationError) as err:
        with Triton(config=config(sagemaker_safe_port_range="x"), workspace=workspace()):
            pass
    assert "--sagemaker-safe-port-range" in str(err.value)
    with pytest.raises(PyTritonValidationError) as err:  # refused as the arguments are read, as tritonserver does
        with Triton(config=config(metrics_config=["bad"]), workspace=workspace()):
            pass
    assert "--metrics-config option format is <setting>=<value>. Got bad" in str(err.value)


# ---- security config -----------------------------------------------------------------------------------------


def test_default_security_config_protects_statistics_with_a_token():
    cfg = config()
    with Triton(config=cfg, workspace=workspace()) as t:
        t.bind("doubled", doubled, VEC, OUT)
        url = f"http://localhost:{cfg.http_port}/v2/models/stats"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=5)
        assert err.value.code == 403
        token = t.get_access_token()
        assert token
        request = urllib.request.Request(url, headers={"triton-access-token": token})
        with urllib.request.urlopen(request, timeout=5) as r:
            assert json.load(r)["model_stats"][0]["name"] == "doubled"
        with httpclient.InferenceServerClient(f"localhost:{cfg.http_port}") as c:
            assert infer(c, "doubled", X).as_numpy("y").tolist() == [[2.0, 4.0]]  # inference stays open


def test_security_config_rejects_unknown_endpoint_names():
    with pytest.raises(PyTritonValidationError):
        TritonSecurityConfig(restricted_endpoints=["statistics", "everything"])


# ---- TritonConfig.from_env ----------------------------------------------------------------------------------------


def test_from_env_converts_types_and_warns_about_unknown_names(monkeypatch, caplog):
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_HTTP_PORT", "12345")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_ALLOW_METRICS", "false")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_LOG_VERBOSE", "2")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_METRICS_CONFIG_1", "summary_latencies=true")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_METRICS_CONFIG_0", "counter_latencies=false")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_NO_SUCH_OPTION", "1")
    logger = logging.getLogger("kernel.triton")
    logger.addHandler(caplog.handler)
    try:
        cfg = TritonConfig.from_env()
    finally:
        logger.removeHandler(caplog.handler)
    assert cfg.http_port == 12345 and cfg.allow_metrics is False and cfg.log_verbose == 2
    assert cfg.metrics_config == ["counter_latencies=false", "summary_latencies=true"]
    assert "no_such_option" in caplog.text


def test_from_env_bad_value_is_a_validation_error(monkeypatch):
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", "eighty")
    with pytest.raises(PyTritonValidationError):
        TritonConfig.from_env()


def test_env_config_is_used_and_explicit_config_wins(monkeypatch):
    http, grpc, metrics, other = free_ports(4)
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_HTTP_PORT", str(other))
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", str(grpc))
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_METRICS_PORT", str(metrics))
    with Triton(config=TritonConfig(http_port=http), workspace=workspace()) as t:
        t.bind("doubled", doubled, VEC, OUT)
        with urllib.request.urlopen(f"http://localhost:{http}/v2/models/doubled/ready", timeout=5) as r:
            assert r.status == 200
        import tritonclient.grpc as grpcclient

        assert grpcclient.InferenceServerClient(f"localhost:{grpc}").is_model_ready("doubled")


# ---- Vertex AI (issue 7) ----------------------------------------------------------------------------------------------


def test_vertex_ai_endpoint(monkeypatch):
    http, grpc, metrics, vertex = free_ports(4)
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HTTP_PORT", str(vertex))
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/health")
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/v2/models/AddOne/infer")
    cfg = TritonConfig(allow_http=True, allow_vertex_ai=True, vertex_ai_port=vertex, http_port=http,
                       grpc_port=grpc, metrics_port=metrics)

    @batch
    def add_one(x):
        return {"y": x + 1}

    with Triton(config=cfg, workspace=workspace()) as t:
        t.bind("AddOne", add_one, VEC, OUT)  # Vertex AI: the server starts at run()/serve()
        assert not t.is_alive()
        t.run()
        with urllib.request.urlopen(f"http://localhost:{vertex}/health", timeout=5) as r:
            assert r.status == 200
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]})
        request = urllib.request.Request(f"http://localhost:{vertex}/v2/models/AddOne/infer", data=body.encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=5) as r:
            outputs = json.load(r)["outputs"]
        assert outputs[0]["name"] == "y" and outputs[0]["data"] == [2.0, 3.0]
        with urllib.request.urlopen(f"http://localhost:{http}/v2/health/ready", timeout=5) as r:
            assert r.status == 200  # allow_http=True keeps KServe HTTP on beside Vertex AI


# ---- decoupled cancellation and warmup ------------------------------------------------------------------------


def test_cancelled_stream_stops_the_generator():
    import queue

    import tritonclient.grpc as grpcclient

    steps = []

    def endless(requests):
        for i in range(1000):
            steps.append(i)
            time.sleep(0.02)
            yield [{"y": r["x"] + i} for r in requests]

    cfg = config()
    with Triton(config=cfg, workspace=workspace()) as t:
        t.bind("endless", endless, VEC, OUT, config=ModelConfig(decoupled=True))
        responses = queue.Queue()
        client = grpcclient.InferenceServerClient(f"localhost:{cfg.grpc_port}")
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        x = grpcclient.InferInput("x", [1, 2], "FP32")
        x.set_data_from_numpy(X)
        client.async_stream_infer("endless", [x])
        for expected in (0, 1):
            result, error = responses.get(timeout=10)
            assert error is None and result.as_numpy("y").tolist() == (X + expected).tolist()
        client.stop_stream(cancel_requests=True)
        client.close()
        time.sleep(0.3)
        seen = len(steps)
        time.sleep(0.3)
        assert len(steps) == seen < 50  # the generator was closed, not run to the end


def test_model_warmup_runs_the_callable_before_serving():
    from kernel.model_config import ModelWarmup, WarmupInput

    shapes = []

    def record(requests):
        shapes.extend(r["x"].shape for r in requests)
        return [{"y": r["x"]} for r in requests]

    warmup = ModelWarmup(name="zeros", batch_size=2, count=3,
                         inputs={"x": WarmupInput(dtype=np.float32, shape=(5,), zero_data=True)})
    with Triton(config=config(), workspace=workspace()) as t:
        t.bind("warm", record, VEC, OUT, config=ModelConfig(model_warmup=[warmup]))
        assert shapes == [(2, 5)] * 3


def test_model_py_models_of_model_repository_are_served_beside_bound_ones():
    import shutil

    from conftest import EXAMPLES

    repo = Path(tempfile.mkdtemp(prefix="pytriton-inproc-repo-"))
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    cfg = config(model_repository=repo)
    with Triton(config=cfg, workspace=workspace()) as t:
        t.bind("doubled", doubled, VEC, OUT)
        with httpclient.InferenceServerClient(f"localhost:{cfg.http_port}") as c:
            assert infer(c, "doubled", X).as_numpy("y").tolist() == [[2.0, 4.0]]
            a = httpclient.InferInput("INPUT0", [4], "FP32")
            a.set_data_from_numpy(np.ones(4, np.float32))
            b = httpclient.InferInput("INPUT1", [4], "FP32")
            b.set_data_from_numpy(np.ones(4, np.float32))
            assert c.infer("add_sub", [a, b]).as_numpy("OUTPUT0").tolist() == [2.0] * 4  # Python backend worker
