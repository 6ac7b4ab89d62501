"""Custom histogram metrics (pb_utils.MetricFamily.HISTOGRAM) as tritonserver 2.51 shows them.

The histogram_metrics model observes 0.2, 0.7, 1.0, 3.0 and 0.5 into buckets
[0.5, 1.0, 2.5] and tries the misuses of Metric(buckets=...). The exposition
block and the errors below are what real Triton served and raised for it.
"""

from __future__ import annotations

import json
import shutil
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import TEST_MODELS, serving

TRITON_BLOCK = """\
# HELP model_process_histogram A custom histogram
# TYPE model_process_histogram histogram
model_process_histogram_count{k="v",model="histogram_metrics"} 5
model_process_histogram_sum{k="v",model="histogram_metrics"} 5.4
model_process_histogram_bucket{k="v",model="histogram_metrics",le="0.5"} 2
model_process_histogram_bucket{k="v",model="histogram_metrics",le="1"} 4
model_process_histogram_bucket{k="v",model="histogram_metrics",le="2.5"} 4
model_process_histogram_bucket{k="v",model="histogram_metrics",le="+Inf"} 5
"""

TRITON_ERRORS = {
    "histogram without buckets": ["TritonModelException", "Failed to create metric. Missing required buckets."],
    "counter with buckets": ["TritonModelException", "Failed to create metric. Unexpected buckets found."],
    "gauge with buckets": ["TritonModelException", "Failed to create metric. Unexpected buckets found."],
    "buckets tuple": ["TritonModelException", "Failed to create metric. Buckets must be a list."],
    "buckets unsorted": ["TritonModelException",
                         "Error when creating Metric: Failed to process the request for model "
                         "'histogram_metrics_0', message: Bucket Boundaries must be strictly sorted"],
    "buckets empty": ["", ""],
    "buckets ints": ["", ""],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(TEST_MODELS / "model_process" / "histogram_metrics", repo / "histogram_metrics")
    yield from serving([repo])


def test_histogram_exposition_is_tritons(server):
    with urllib.request.urlopen(f"http://localhost:{server.metrics_port}/metrics") as r:
        text = r.read().decode()
    assert TRITON_BLOCK in text


def test_bucket_misuse_raises_what_triton_raises(server):
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], np.float32))
    report = json.loads(client.infer("histogram_metrics", [tensor]).as_numpy("REPORT")[0])
    for case, expected in TRITON_ERRORS.items():
        assert report[case] == expected, case
    # Triton's binding cannot convert ["x"] to its doubles: a RuntimeError (pybind11's wording there).
    assert report["buckets str items"][0] == "RuntimeError"
