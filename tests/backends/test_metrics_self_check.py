"""A model that reads its own custom metrics from the metrics page while its execute runs.

Triton's stub waits for the server to apply every metric operation (creating a metric, increment,
set, observe), so a model that checks the page right after, as Triton's QA model custom_metrics does
with unittest inside execute, finds what it just did. metrics_self_check does that in a synchronous
execute (which Kernel runs inline on the worker's loop); real tritonserver 2.51 reports nothing
missing for it on every call.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import TEST_MODELS, serving


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(TEST_MODELS / "model_process" / "metrics_self_check", repo / "metrics_self_check")
    yield from serving([repo])


def test_metric_operations_are_on_the_page_before_execute_goes_on(server):
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    url = f"http://localhost:{server.metrics_port}/metrics".encode()
    try:
        for _ in range(3):  # repeated, as Triton's QA runs its self-checks under a leak probe
            tensor = httpclient.InferInput("METRICS_URL", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([url], np.object_))
            report = json.loads(client.infer("metrics_self_check", [tensor]).as_numpy("REPORT")[0])
            assert report == {"after_create": [], "after_update": []}
    finally:
        client.close()
