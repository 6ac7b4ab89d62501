"""Models that never answer are visible, cancellable, and wedge nothing else (issue 14 item 13).

tritonserver 2.51 (checked with the real server) leaves the requests of a non-decoupled
execute() that returns None unanswered, and logs nothing; a hung execute() holds its
instance. Kernel keeps that behaviour (a model may still answer later through its
response senders) but logs each such request once with its age, and a client that gives
up cancels it: the server goes on answering everything else.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from conftest import KernelProcess, running

MODELS = Path(__file__).resolve().parent / "models"
ONE = {"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [1]}]}


@pytest.fixture(scope="module")
def server():
    yield from running(KernelProcess([MODELS], "--backend-config=python,request-age-warning-seconds=1",
                                     "--exit-timeout-secs=2"))


def assert_serving(server) -> None:
    body = {"inputs": [{"name": n, "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]} for n in ("INPUT0", "INPUT1")]}
    r = httpx.post(f"http://{server.url}/v2/models/add_sub_x2/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("model", ["returns_none", "hang"])
def test_an_unanswered_request_is_logged_with_its_age_and_the_client_can_give_up(server, model):
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"http://{server.url}/v2/models/{model}/infer", json={**ONE, "id": f"lost-{model}"}, timeout=2)
    assert server.wait_for_log(f"request 'lost-{model}' on model instance '{model}_0", timeout=15), \
        server.log()[-3000:]
    assert server.log().count(f"request 'lost-{model}'") == 1  # once, not on every check
    assert_serving(server)
    # The model's own readiness is unaffected; its statistics still answer.
    assert httpx.get(f"http://{server.url}/v2/models/{model}/stats", timeout=10).status_code == 200


def test_a_long_stream_that_keeps_answering_is_not_reported(server):
    """A decoupled request older than the threshold is fine while its responses keep coming."""
    body = {"IN": [1, 2, 3, 4, 5], "DELAY": [600] * 5, "id": "long-stream"}  # 3 s in all, 0.6 s apart
    r = httpx.post(f"http://{server.url}/v2/models/repeat_int32/generate_stream", json=body, timeout=30)
    assert r.status_code == 200 and r.text.count("data:") == 5, r.text
    assert "request 'long-stream'" not in server.log()
