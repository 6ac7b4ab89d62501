"""inference_timeout_s of the decoupled clients, as PyTriton 0.7 applies it (measured with its own
clients against the same model): the blocking DecoupledModelClient sets no limit on the wait for
responses; AsyncioDecoupledModelClient limits the wait for each next response, never the whole
stream. Against a real `kernel serve` (repeat_int32 sends one response per element of IN,
DELAY[i] ms apart)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kernel.client import AsyncioDecoupledModelClient, DecoupledModelClient
from kernel.client.exceptions import PyTritonClientTimeoutError


@pytest.fixture
def grpc_url(server):
    return f"grpc://{server.grpc_url}"


def request(delays_ms):
    return {"IN": np.arange(len(delays_ms), dtype=np.int32), "DELAY": np.array(delays_ms, np.uint32)}


def test_sync_returns_every_response_when_each_takes_the_whole_timeout(grpc_url):
    """The issue's case: 0.1 s before each of two responses, inference_timeout_s=0.1."""
    with DecoupledModelClient(grpc_url, "repeat_int32", inference_timeout_s=0.1) as client:
        got = [int(r["OUT"][0]) for r in client.infer_sample(**request([100, 100]))]
    assert got == [0, 1]


def test_sync_waits_past_the_timeout_for_a_slow_response(grpc_url):
    with DecoupledModelClient(grpc_url, "repeat_int32", inference_timeout_s=0.2) as client:
        started = time.monotonic()
        got = [int(r["OUT"][0]) for r in client.infer_sample(**request([0, 1200]))]
        assert got == [0, 1]
        assert time.monotonic() - started >= 1.1


async def _collect(client, delays_ms):
    return [int(r["OUT"][0]) async for r in client.infer_sample(**request(delays_ms))]


async def test_asyncio_limits_each_response_not_the_stream(grpc_url):
    async with AsyncioDecoupledModelClient(grpc_url, "repeat_int32", inference_timeout_s=0.4) as client:
        started = time.monotonic()
        assert await _collect(client, [100] * 6) == list(range(6))  # 0.6 s in all, 0.1 s apart
        assert time.monotonic() - started >= 0.55


async def test_asyncio_times_out_waiting_for_the_next_response(grpc_url):
    async with AsyncioDecoupledModelClient(grpc_url, "repeat_int32", inference_timeout_s=0.3) as client:
        got = []
        started = time.monotonic()
        with pytest.raises(PyTritonClientTimeoutError,
                           match=r"Timeout while waiting for model repeat_int32 to return next response 0.3s"):
            async for r in client.infer_sample(**request([0, 2000])):
                got.append(int(r["OUT"][0]))
        assert got == [0]
        assert time.monotonic() - started < 1.5
        assert await _collect(client, [0]) == [0]  # the client still works


def test_issue_scenario_with_a_bound_generator():
    """The issue's model, bound in-process: 0.1 s before each of two responses, inference_timeout_s=0.1."""
    import asyncio
    import tempfile
    from pathlib import Path

    from conftest import free_ports
    from kernel.model_config import ModelConfig, Tensor
    from kernel.triton import Triton, TritonConfig

    def two_slow_responses(requests):
        for i in range(2):
            time.sleep(0.1)
            yield [{"y": r["x"] + i} for r in requests]

    http, grpc, metrics = free_ports(3)
    workspace = Path(tempfile.mkdtemp(prefix="kernel-decoupled-")) / "ws"
    with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics), workspace=workspace) as t:
        t.bind("two_slow", two_slow_responses, [Tensor(name="x", dtype=np.float32, shape=(1,))],
               [Tensor(name="y", dtype=np.float32, shape=(1,))], config=ModelConfig(max_batch_size=4, decoupled=True))
        x = np.array([1.0], np.float32)
        with DecoupledModelClient(f"grpc://localhost:{grpc}", "two_slow", inference_timeout_s=0.1) as client:
            assert [r["y"].tolist() for r in client.infer_sample(x=x)] == [[1.0], [2.0]]

        async def gaps_within_the_limit():
            async with AsyncioDecoupledModelClient(f"grpc://localhost:{grpc}", "two_slow",
                                                   inference_timeout_s=1.0) as client:
                return [r["y"].tolist() async for r in client.infer_sample(x=x)]

        assert asyncio.run(gaps_within_the_limit()) == [[1.0], [2.0]]
