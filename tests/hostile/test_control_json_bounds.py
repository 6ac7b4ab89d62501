"""Control routes refuse JSON with too many values before decoding it (issue 31, the general rule).

The logging, trace-setting, shared-memory and repository routes decode their body whole, as Python
objects, on the event loop. A body of `[],[],...` within --http-max-input-size (64 MiB) took 5 s
and 1.7 GB to decode; 24 MiB, about 2 s and 600 MB per request. A control request holds a few
values, so a body that may hold more than 65536 is refused with 400 naming the limit, counted
(beside the loop when large) before anything is decoded. Against a real `kernel serve`.
"""

from __future__ import annotations

import base64
import json

import httpx
import pytest

from conftest import EXAMPLES, KernelProcess, running
from liveness import LivenessProbe
from test_http2_limits import rss_mb

MIB = 1 << 20
ROUTES = ["/v2/logging", "/v2/trace/setting", "/v2/repository/models/add_sub/load",
          "/v2/systemsharedmemory/region/r/register", "/v2/cudasharedmemory/region/r/register"]


@pytest.fixture(scope="module")
def server():
    yield from running(KernelProcess([EXAMPLES], "--model-control-mode=explicit", "--load-model=add_sub"))


@pytest.fixture(scope="module")
def empty_arrays() -> bytes:
    """24 MiB of JSON: an object whose one member is ~8 million empty arrays."""
    return b'{"a":[' + b"[]," * (8 * MIB) + b"[]]}"


@pytest.mark.parametrize("route", ROUTES)
def test_a_control_body_of_millions_of_values_is_refused_without_freezing_the_front(server, empty_arrays, route):
    before = rss_mb(server.proc.pid)
    with httpx.Client(base_url=f"http://{server.url}", timeout=60) as client:
        with LivenessProbe(server.url) as probe:
            answers = [client.post(route, content=empty_arrays) for _ in range(3)]
        grown = rss_mb(server.proc.pid) - before
        assert probe.p99_ms() < 100, f"/v2/health/live froze while {route} decoded: {probe.summary()}"
        assert grown < 150, f"front RSS grew {grown:.0f} MB"
        for r in answers:
            assert r.status_code == 400, r.text[:200]
            assert "more than 65536 JSON values" in r.json()["error"], r.text[:200]
        assert client.get("/v2/logging").status_code == 200


def test_a_model_load_with_a_large_file_is_still_taken(server):
    """The bound counts values, not bytes: a load carrying a 24 MiB file (one base64 string) passes."""
    config = json.dumps({"backend": "python", "max_batch_size": 0,
                         "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("INPUT0", "INPUT1")],
                         "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]}
                                    for n in ("OUTPUT0", "OUTPUT1")]})
    model = (EXAMPLES / "add_sub" / "1" / "model.py").read_bytes()
    weights = bytes(24 * MIB)
    body = {"parameters": {"config": config,
                           "file:1/model.py": base64.b64encode(model).decode(),
                           "file:1/weights.bin": base64.b64encode(weights).decode()}}
    with httpx.Client(base_url=f"http://{server.url}", timeout=120) as client:
        r = client.post("/v2/repository/models/big_files/load", json=body)
        assert r.status_code == 200, r.text[:300]
        assert client.get("/v2/models/big_files/ready").status_code == 200
