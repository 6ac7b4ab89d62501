"""A client that cancels a request the model never answers frees it (issue 23 E).

Models that never answer some requests exist: a decoupled model that never sends, a non-decoupled
one that returns None and forgets its response senders, an execute() that never returns. Before,
when their clients gave up (gRPC cancel, a closed connection), the requests stayed pending in the
front for good: the pending count said so, and shutdown waited its whole exit timeout for them.
Now the model still sees `request.is_cancelled()`, and a cancelled request it stays silent on is
answered CANCELLED by the front after a short grace; a request cancelled while it waits in a
scheduler queue behind executes that never end leaves the queue too.
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import KernelProcess

MODELS = Path(__file__).resolve().parents[1] / "models" / "cancel"
EXIT_TIMEOUT_S = 30


def pending(server, model: str) -> int:
    with urllib.request.urlopen(f"http://localhost:{server.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.search(rf'^nv_inference_pending_request_count{{model="{model}",version="1"}} (\S+)$', text, re.M)
    assert found, text
    return int(float(found.group(1)))


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.fixture
def server():
    k = KernelProcess([MODELS], "--exit-timeout-secs", str(EXIT_TIMEOUT_S))
    try:
        yield k.wait_ready()
    finally:
        k.stop()


def send(server, model: str, count: int) -> list:
    """count requests from count clients; returns what cancels each (a unary call, or a decoupled
    model's stream)."""
    cancels = []
    for i in range(count):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput("IN", [1, 4] if model == "hang_batched" else [4], "FP32")
        tensor.set_data_from_numpy(np.ones(tensor.shape(), np.float32))
        if model == "never_sends":  # decoupled: a stream
            client.start_stream(callback=lambda result, error: None)
            client.async_stream_infer(model, [tensor], request_id=f"r{i}")
            cancels.append(lambda client=client: client.stop_stream(cancel_requests=True))
        else:
            call = client.async_infer(model, [tensor], callback=lambda result, error: None, request_id=f"r{i}")
            cancels.append(call.cancel)
    return cancels


def assert_shutdown_is_not_held(server) -> None:
    started = time.monotonic()
    server.stop(timeout=EXIT_TIMEOUT_S + 10)
    took = time.monotonic() - started
    assert took < EXIT_TIMEOUT_S / 3, f"shutdown took {took:.1f} s:\n{server.log()[-2000:]}"


@pytest.mark.parametrize("model", ["never_sends", "forgets"])
def test_twenty_cancelled_requests_the_model_never_answers_are_freed(server, model):
    cancels = send(server, model, 20)
    # One instance: the requests all went to its worker, which holds them (the first counts as executing).
    assert wait_for(lambda: pending(server, model) == 19, 15), pending(server, model)
    for cancel in cancels:
        cancel()
    assert server.wait_for_log(f"{model} saw the cancellation of", times=20, timeout=15), server.log()[-3000:]
    assert wait_for(lambda: pending(server, model) == 0, 10), pending(server, model)
    assert_shutdown_is_not_held(server)


@pytest.mark.parametrize("model, queued", [("hang_batched", 5), ("hang_two", 4)])
def test_requests_cancelled_while_queued_behind_executes_that_never_end_leave_the_queue(server, model, queued):
    cancels = send(server, model, 6)
    assert wait_for(lambda: pending(server, model) == queued, 15), pending(server, model)
    for cancel in cancels:
        cancel()
    assert wait_for(lambda: pending(server, model) == 0, 10), pending(server, model)
    assert_shutdown_is_not_held(server)
