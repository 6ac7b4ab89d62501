"""A bound callable raising PyTritonUnrecoverableError stops the server, as PyTriton 0.7 does: the
failing request gets the error, is_alive() turns false at once, serve() returns (without waiting for
its monitoring period), the ports close and other models stop with it. Sync, async and decoupled
callables, and subclasses of the error, all count."""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import free_ports
from kernel.exceptions import PyTritonUnrecoverableError
from kernel.model_config import ModelConfig, Tensor
from kernel.triton import Triton, TritonConfig

VEC = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
OUT = [Tensor(name="y", dtype=np.float32, shape=(-1,))]
X = np.array([[1.0, 2.0]], np.float32)


class DeviceLost(PyTritonUnrecoverableError):
    """A program's own subclass: PyTriton recognises it with isinstance."""


def config() -> TritonConfig:
    http, grpc, metrics = free_ports(3)
    return TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)


def workspace() -> Path:
    return Path(tempfile.mkdtemp(prefix="pytriton-fatal-")) / "ws"


def doubled(requests):
    return [{"y": r["x"] * 2} for r in requests]


def sync_fatal(requests):
    if (requests[0]["x"] < 0).any():
        raise PyTritonUnrecoverableError("the device is gone")
    return doubled(requests)


async def async_fatal(requests):
    await asyncio.sleep(0)
    raise DeviceLost("async device is gone")


def stream_fatal(requests):
    yield doubled(requests)
    raise PyTritonUnrecoverableError("stream device is gone")


def infer(client, model, x):
    t = httpclient.InferInput("x", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    return client.infer(model, [t])


def start_serving(t: Triton) -> threading.Thread:
    """serve() on a thread with PyTriton's default monitoring period (10 s): it must return promptly anyway."""
    serving = threading.Thread(target=t.serve)
    serving.start()
    deadline = time.time() + 60
    while time.time() < deadline and not t.is_connected():
        time.sleep(0.05)
    assert t.is_connected()
    return serving


def test_serve_returns_and_ports_close_after_unrecoverable_error():
    cfg = config()
    t = Triton(config=cfg, workspace=workspace())
    t.bind("fatal", sync_fatal, VEC, OUT, config=ModelConfig(max_batch_size=4))
    t.bind("other", doubled, VEC, OUT, config=ModelConfig(max_batch_size=4))
    serving = start_serving(t)
    with httpclient.InferenceServerClient(f"localhost:{cfg.http_port}") as c:
        assert infer(c, "fatal", X).as_numpy("y").tolist() == [[2.0, 4.0]]  # a healthy call first
        assert t.is_alive()
        with pytest.raises(InferenceServerException, match="the device is gone"):
            infer(c, "fatal", -X)
    assert not t.is_alive()  # at once, before the server has finished stopping
    started = time.monotonic()
    serving.join(30)
    assert not serving.is_alive() and time.monotonic() - started < 8
    with pytest.raises(OSError):  # the other model went with the server
        urllib.request.urlopen(f"http://localhost:{cfg.http_port}/v2/models/other/ready", timeout=1)
    assert t.stop() is False  # already stopped


def test_async_callable_subclass_stops_a_running_server():
    cfg = config()
    t = Triton(config=cfg, workspace=workspace())
    t.bind("fatal", async_fatal, VEC, OUT, config=ModelConfig(max_batch_size=4))
    t.run()  # no serve(): the server still stops, as in PyTriton
    with httpclient.InferenceServerClient(f"localhost:{cfg.http_port}") as c:
        with pytest.raises(InferenceServerException, match="async device is gone"):
            infer(c, "fatal", X)
    assert not t.is_alive()
    assert wait_closed(cfg.http_port)
    assert not t.is_connected()


def wait_closed(port: int, timeout: float = 20.0) -> bool:
    """Whether the port stops answering within `timeout` (the server stops on a thread of its own)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://localhost:{port}/v2/health/live", timeout=1)
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_decoupled_callable_fails_its_stream_then_the_server_stops():
    cfg = config()
    t = Triton(config=cfg, workspace=workspace())
    t.bind("fatal", stream_fatal, VEC, OUT, config=ModelConfig(max_batch_size=4, decoupled=True))
    serving = start_serving(t)
    got, errors, done = [], [], threading.Event()

    def callback(result, error):
        if error is not None:
            errors.append(error)
            done.set()
        elif result.as_numpy("y") is not None:
            got.append(result.as_numpy("y").tolist())

    client = grpcclient.InferenceServerClient(f"localhost:{cfg.grpc_port}")
    client.start_stream(callback=callback)
    x = grpcclient.InferInput("x", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    client.async_stream_infer("fatal", [x])
    assert done.wait(20)
    assert got == [[[2.0, 4.0]]]
    assert "stream device is gone" in str(errors[0])
    client.stop_stream()
    client.close()
    serving.join(30)
    assert not serving.is_alive() and not t.is_alive()


def test_ordinary_errors_do_not_stop_the_server():
    def plain_error(requests):
        raise RuntimeError("just this batch")

    cfg = config()
    with Triton(config=cfg, workspace=workspace()) as t:
        t.bind("plain", plain_error, VEC, OUT)
        t.run()
        with httpclient.InferenceServerClient(f"localhost:{cfg.http_port}") as c:
            with pytest.raises(InferenceServerException, match="just this batch"):
                infer(c, "plain", X)
            time.sleep(0.3)
            assert t.is_alive()
            assert c.is_server_live()
