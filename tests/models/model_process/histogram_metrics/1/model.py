"""A custom histogram, observed at initialize, and the errors of Metric(buckets=...) misuse.

execute returns {case: [exception type, message]} as REPORT; the histogram
stays alive for /metrics.
"""

import json

import numpy as np

import triton_python_backend_utils as pb_utils

def _metric(name, kind, buckets):
    kind = getattr(pb_utils.MetricFamily, kind)  # looked up late: Triton's auto-complete pass has no MetricFamily
    family = pb_utils.MetricFamily(name, "misuse", kind)
    return family.Metric(labels={"a": "b"}, buckets=buckets)


CASES = {
    "histogram without buckets": lambda: _metric("hm_no_buckets", "HISTOGRAM", None),
    "counter with buckets": lambda: _metric("hm_counter", "COUNTER", [1.0]),
    "gauge with buckets": lambda: _metric("hm_gauge", "GAUGE", [1.0]),
    "buckets tuple": lambda: _metric("hm_tuple", "HISTOGRAM", (1.0,)),
    "buckets str items": lambda: _metric("hm_str", "HISTOGRAM", ["x"]),
    "buckets unsorted": lambda: _metric("hm_unsorted", "HISTOGRAM", [2.0, 1.0]),
    "buckets empty": lambda: _metric("hm_empty", "HISTOGRAM", []),
    "buckets ints": lambda: _metric("hm_ints", "HISTOGRAM", [1, 5]),
}


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily("model_process_histogram", "A custom histogram",
                                             pb_utils.MetricFamily.HISTOGRAM)
        self.metric = self.family.Metric(labels={"model": "histogram_metrics", "k": "v"}, buckets=[0.5, 1.0, 2.5])
        for value in (0.2, 0.7, 1.0, 3.0, 0.5):
            self.metric.observe(value)
        self.report = {}
        for label, call in CASES.items():
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - what was raised is the point
                self.report[label] = [type(exc).__name__, str(exc)]
            else:
                self.report[label] = ["", ""]

    def execute(self, requests):
        text = json.dumps(self.report).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([text], dtype=np.object_))])
                for _ in requests]
