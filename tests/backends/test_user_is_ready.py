"""A model's own is_ready(): its timeout, and one check at a time.

slow_ready's is_ready() takes 6.5 s here, past the 5 s a readiness query waits:
the query that started the check reads NOT READY when its 5 s are up; a query
arriving 3 s later joins the check still running and returns its answer
(ready) instead of starting a second is_ready() call.
"""

from __future__ import annotations

import shutil
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import TEST_MODELS, serving


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(TEST_MODELS / "model_process" / "slow_ready", repo / "slow_ready")
    yield from serving([repo])


def set_delay(server, seconds: float) -> int:
    """Sets is_ready()'s duration; returns how many times is_ready() ran so far."""
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("DELAY_S", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], np.float32))
    return int(client.infer("slow_ready", [tensor]).as_numpy("CALLS")[0])


def ready_status(server) -> int:
    try:
        with urllib.request.urlopen(f"http://{server.url}/v2/models/slow_ready/ready", timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_query_joins_the_check_in_progress(server):
    before = set_delay(server, 6.5)
    statuses = {}

    def query(name):
        statuses[name] = ready_status(server)

    first = threading.Thread(target=query, args=("first",))
    first.start()
    time.sleep(3)
    second = threading.Thread(target=query, args=("second",))
    second.start()
    first.join()
    second.join()
    calls = set_delay(server, 0)
    assert statuses["first"] == 400  # its 5 s passed before is_ready() answered: not ready
    assert statuses["second"] == 200  # waited for that same check, which then answered True
    assert calls - before == 1  # one is_ready() call served both queries
    assert ready_status(server) == 200
