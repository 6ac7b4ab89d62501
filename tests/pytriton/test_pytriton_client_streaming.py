"""kernel.client's decoupled and asyncio clients against a real `kernel serve`."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

from kernel.client import AsyncioDecoupledModelClient, AsyncioModelClient, DecoupledModelClient, ModelClient
from kernel.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientModelUnavailableError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)

A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
B = np.array([0.5, 0.5, 0.5, 0.5], np.float32)


@pytest.fixture
def grpc_url(server):
    return f"grpc://{server.grpc_url}"


def values(responses):
    return [(int(r["OUT"][0]), int(r["IDX"][0])) for r in responses]


# ---- DecoupledModelClient ---------------------------------------------------------------------


def test_decoupled_responses(grpc_url):
    with DecoupledModelClient(grpc_url, "repeat_int32") as client:
        responses = client.infer_sample(np.array([5, 6, 7], np.int32))
        assert values(responses) == [(5, 0), (6, 1), (7, 2)]
        assert list(client.infer_sample(IN=np.array([], np.int32))) == []  # only the final flag
        assert values(client.infer_sample(IN=np.array([9], np.int32))) == [(9, 0)]


def test_decoupled_error_response(grpc_url):
    with DecoupledModelClient(grpc_url, "stream_error") as client:
        responses = client.infer_sample(np.array([1, -2, 3], np.int32))
        assert int(next(responses)["OUT"][0]) == 1
        with pytest.raises(PyTritonClientInferenceServerError, match="negative value -2"):
            next(responses)
        assert [int(r["OUT"][0]) for r in client.infer_sample(np.array([4, 5], np.int32))] == [4, 5]


def test_decoupled_close_cancels_the_request(server, grpc_url):
    """Closing the response iterator early cancels the responses still to come."""
    cancelled = "cancelled after 1 responses"
    seen_before = server.log().count(cancelled)
    with DecoupledModelClient(grpc_url, "repeat_int32") as client:
        responses = client.infer_sample(
            IN=np.array([1, 2], np.int32), DELAY=np.array([0, 2500], np.uint32)
        )
        assert values([next(responses)]) == [(1, 0)]
        responses.close()
        with pytest.raises(StopIteration):
            next(responses)
        assert server.wait_for_log(cancelled, times=seen_before + 1)
        assert values(client.infer_sample(IN=np.array([3], np.int32))) == [(3, 0)]


def test_decoupled_one_call_at_a_time(grpc_url):
    with DecoupledModelClient(grpc_url, "repeat_int32") as client:
        first = client.infer_sample(np.array([1, 2], np.int32))
        with pytest.raises(PyTritonClientInferenceServerError, match="in progress"):
            client.infer_sample(np.array([3], np.int32))
        assert values(first) == [(1, 0), (2, 1)]
        assert values(client.infer_sample(np.array([3], np.int32))) == [(3, 0)]


def test_decoupled_client_mismatches(server, grpc_url):
    with pytest.raises(PyTritonClientValueError, match="grpc"):
        DecoupledModelClient(f"http://{server.url}", "repeat_int32")
    with DecoupledModelClient(grpc_url, "add_sub") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="not decoupled"):
            client.infer_sample(A, B)
    with DecoupledModelClient(grpc_url, "repeat_int32") as client:
        with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
            client.infer_batch(np.array([[1]], np.int32))


def test_decoupled_closed(grpc_url):
    client = DecoupledModelClient(grpc_url, "repeat_int32")
    responses = client.infer_sample(IN=np.array([1, 2], np.int32), DELAY=np.array([0, 1000], np.uint32))
    next(responses)
    client.close()  # cancels the stream still running
    with pytest.raises(PyTritonClientClosedError):
        client.infer_sample(np.array([1], np.int32))
    with ModelClient(grpc_url, "add_sub") as other:  # the server is unaffected
        np.testing.assert_array_equal(other.infer_sample(A, B)["OUTPUT0"], A + B)


# ---- AsyncioModelClient ---------------------------------------------------------------------


async def test_asyncio_client(url):
    async with AsyncioModelClient(url, "add_sub") as client:
        result = await client.infer_sample(A, B)
        np.testing.assert_array_equal(result["OUTPUT0"], A + B)
        named = await client.infer_sample(INPUT0=A, INPUT1=B)
        np.testing.assert_array_equal(named["OUTPUT1"], A - B)
        config = await client.model_config
        assert [t.name for t in config.inputs] == ["INPUT0", "INPUT1"]
        with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
            await client.infer_batch(A[None], B[None])
        await client.wait_for_model(5)
        async with AsyncioModelClient.from_existing_client(client) as copy:
            assert await copy.model_config is config
            np.testing.assert_array_equal((await copy.infer_sample(A, B))["OUTPUT0"], A + B)


async def test_asyncio_client_batching_and_bytes(url):
    async with AsyncioModelClient(url, "string_identity") as client:
        sample = await client.infer_sample(np.array([b"a", b"bc"], dtype=object))
        batch = await client.infer_batch(np.array([[b"x"], [b"y"]], dtype=object))
    assert sample["OUTPUT0"].tolist() == [b"a", b"bc"]
    assert batch["OUTPUT0"].tolist() == [[b"x"], [b"y"]]


async def test_asyncio_client_concurrent_requests(url):
    async with AsyncioModelClient(url, "add_sub") as client:
        results = await asyncio.gather(*(client.infer_sample(A, B * i) for i in range(16)))
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result["OUTPUT0"], A + B * i)


async def test_asyncio_client_parameters_and_errors(url):
    async with AsyncioModelClient(url, "params_echo") as client:
        result = await client.infer_sample(np.array([1], np.int32), parameters={"mode": "fast", "n": 2})
        assert json.loads(result["PARAMS_JSON"][0]) == {"mode": "fast", "n": 2}
        with pytest.raises(PyTritonClientValueError):
            await client.infer_sample(np.array([1], np.int32), INPUT=np.array([1], np.int32))
    async with AsyncioModelClient(url, "raises") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="this model always fails"):
            await client.infer_sample(A)
    async with AsyncioModelClient(url, "repeat_int32") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="decoupled"):
            await client.infer_sample(np.array([1], np.int32))


async def test_asyncio_client_timeouts_and_unknown_model(url):
    async with AsyncioModelClient(url, "slow_add_sub", inference_timeout_s=0.5) as client:
        start = time.monotonic()
        with pytest.raises(PyTritonClientTimeoutError):
            await client.infer_sample(A, B)
        assert time.monotonic() - start < 1.8
    client = AsyncioModelClient(url, "no_such_model", init_timeout_s=0.5)
    with pytest.raises(PyTritonClientModelUnavailableError, match="no_such_model"):
        await client.infer_sample(A)
    await client.close()
    with pytest.raises(PyTritonClientModelUnavailableError):
        async with AsyncioModelClient(url, "no_such_model", lazy_init=False, init_timeout_s=0.5):
            pass


async def test_asyncio_client_closed(url):
    client = AsyncioModelClient(url, "add_sub")
    await client.infer_sample(A, B)
    await client.close()
    await client.close()
    with pytest.raises(PyTritonClientClosedError):
        await client.infer_sample(A, B)
    with pytest.raises(PyTritonClientClosedError):
        await client.model_config


# ---- AsyncioDecoupledModelClient ------------------------------------------------------------


async def test_asyncio_decoupled(grpc_url):
    async with AsyncioDecoupledModelClient(grpc_url, "repeat_int32") as client:
        got = [r async for r in client.infer_sample(np.array([4, 5, 6], np.int32))]
        assert values(got) == [(4, 0), (5, 1), (6, 2)]
        assert [r async for r in client.infer_sample(IN=np.array([], np.int32))] == []
        # several streams at once on one client
        many = await asyncio.gather(*(_collect(client.infer_sample(np.array([i], np.int32))) for i in range(4)))
        assert [values(r) for r in many] == [[(i, 0)] for i in range(4)]


async def _collect(stream):
    return [r async for r in stream]


async def test_asyncio_decoupled_errors(server, grpc_url):
    async with AsyncioDecoupledModelClient(grpc_url, "stream_error") as client:
        got = []
        with pytest.raises(PyTritonClientInferenceServerError, match="negative value -2"):
            async for response in client.infer_sample(np.array([1, -2], np.int32)):
                got.append(int(response["OUT"][0]))
        assert got == [1]
    async with AsyncioDecoupledModelClient(grpc_url, "repeat_int32", inference_timeout_s=0.5) as client:
        with pytest.raises(PyTritonClientTimeoutError):
            async for _ in client.infer_sample(IN=np.array([1, 2], np.int32), DELAY=np.array([0, 2500], np.uint32)):
                pass
    async with AsyncioDecoupledModelClient(grpc_url, "add_sub") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="not decoupled"):
            async for _ in client.infer_sample(A, B):
                pass
    with pytest.raises(PyTritonClientValueError, match="grpc"):
        AsyncioDecoupledModelClient(f"http://{server.url}", "repeat_int32")
