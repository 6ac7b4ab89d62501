"""`async def execute` models awaiting a BLS call each run side by side, as with tritonserver 2.51.

Triton's QA test async_execute/concurrency_test.py (test_concurrent_execute_multi_request_bls):
four requests on one stream to a decoupled async model whose execute awaits
`async_exec(decoupled=True)` on a callee that sleeps, then walks the responses with a plain
`for`. Triton's awaited call resolves once the callee's first response is there, so that `for`
never blocks and the four executes overlap: all four answers come after one callee sleep.
"""

from __future__ import annotations

import queue
import shutil
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import TEST_MODELS, serving

SLEEP_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for name in ("async_sleep", "async_bls_for"):
        shutil.copytree(TEST_MODELS / "model_process" / name, repo / name)
    yield from serving([repo])


def _stream(server, count: int, wait_s: float) -> tuple[list, float]:
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(lambda result, error: got.put((time.monotonic(), result, error)))
        start = time.monotonic()
        for i in range(count):
            x = grpcclient.InferInput("WAIT_S", [1, 1], "FP32")
            x.set_data_from_numpy(np.full([1, 1], wait_s, np.float32))
            client.async_stream_infer("async_bls_for", [x], request_id=str(i))
        answers = []
        for _ in range(count):
            answers.append(got.get(timeout=30))
        client.stop_stream()
    finally:
        client.close()
    return answers, start


def test_four_async_executes_awaiting_bls_overlap(server):
    _stream(server, 1, 0.0)  # both workers warm
    answers, start = _stream(server, 4, SLEEP_S)
    for _, result, error in answers:
        assert error is None, error
        assert result.as_numpy("SLEPT").tolist() == [[SLEEP_S]]
    assert sorted(result.get_response().id for _, result, _ in answers) == ["0", "1", "2", "3"]
    last = max(t for t, _, _ in answers) - start
    # One after the other they take 4 x 1 s; side by side one sleep and the calls' overhead.
    assert last < 2 * SLEEP_S, f"the four answers took {last:.2f} s: the executes did not overlap"
