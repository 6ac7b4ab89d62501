"""headers= and access_token reach the server: a Kernel whose inference API is restricted to a header.

PyTriton's TritonSecurityConfig protects endpoints with the `triton-access-token` header
(gRPC: `triton-grpc-protocol-triton-access-token`); ModelClient(access_token=...) sends it.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import EXAMPLES, TEST_MODELS, KernelProcess
from kernel.client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)
from kernel.client.exceptions import PyTritonClientInferenceServerError

A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
TOKEN = "s3cret-token"
HEADER = {"http": "triton-access-token", "grpc": "triton-grpc-protocol-triton-access-token"}


@pytest.fixture(scope="module")
def restricted():
    kernel = KernelProcess(
        [EXAMPLES, TEST_MODELS / "good"],
        f"--http-restricted-api=inference:triton-access-token={TOKEN}",
        f"--grpc-restricted-protocol=inference:triton-access-token={TOKEN}",
    )
    try:
        yield kernel.wait_ready()
    finally:
        kernel.stop()


@pytest.fixture(params=["http", "grpc"])
def scheme(request):
    return request.param


def url_of(kernel, scheme: str) -> str:
    return f"http://{kernel.url}" if scheme == "http" else f"grpc://{kernel.grpc_url}"


def test_without_the_header_the_server_refuses(restricted, scheme):
    with ModelClient(url_of(restricted, scheme), "add_sub") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="restricted"):
            client.infer_sample(A, A)
        with pytest.raises(PyTritonClientInferenceServerError, match="restricted"):
            client.infer_sample(A, A, headers={HEADER[scheme]: "wrong"})


def test_per_call_headers_reach_the_server(restricted, scheme):
    with ModelClient(url_of(restricted, scheme), "add_sub") as client:
        result = client.infer_sample(A, A, headers={HEADER[scheme]: TOKEN})
    np.testing.assert_array_equal(result["OUTPUT0"], A * 2)
    with FuturesModelClient(url_of(restricted, scheme), "add_sub") as client:
        result = client.infer_sample(A, A, headers={HEADER[scheme]: TOKEN}).result(timeout=30)
    np.testing.assert_array_equal(result["OUTPUT1"], A * 0)


def test_access_token(restricted, scheme):
    with ModelClient(url_of(restricted, scheme), "add_sub", access_token=TOKEN) as client:
        np.testing.assert_array_equal(client.infer_sample(A, A)["OUTPUT0"], A * 2)
        with ModelClient.from_existing_client(client) as copy:  # the token goes along
            np.testing.assert_array_equal(copy.infer_sample(A, A)["OUTPUT0"], A * 2)


async def test_asyncio_client_headers(restricted, scheme):
    async with AsyncioModelClient(url_of(restricted, scheme), "add_sub") as client:
        result = await client.infer_sample(A, A, headers={HEADER[scheme]: TOKEN})
        np.testing.assert_array_equal(result["OUTPUT0"], A * 2)
        with pytest.raises(PyTritonClientInferenceServerError, match="restricted"):
            await client.infer_sample(A, A)


def test_decoupled_stream_headers(restricted):
    url = url_of(restricted, "grpc")
    with DecoupledModelClient(url, "repeat_int32") as client:
        responses = client.infer_sample(np.array([1, 2], np.int32), headers={HEADER["grpc"]: TOKEN})
        assert [int(r["OUT"][0]) for r in responses] == [1, 2]
        with pytest.raises(PyTritonClientInferenceServerError, match="restricted"):
            list(client.infer_sample(np.array([1, 2], np.int32)))


async def test_asyncio_decoupled_stream_headers(restricted):
    async with AsyncioDecoupledModelClient(url_of(restricted, "grpc"), "repeat_int32") as client:
        got = [r async for r in client.infer_sample(np.array([3], np.int32), headers={HEADER["grpc"]: TOKEN})]
        assert [int(r["OUT"][0]) for r in got] == [3]
        with pytest.raises(PyTritonClientInferenceServerError, match="restricted"):
            async for _ in client.infer_sample(np.array([3], np.int32)):
                pass
