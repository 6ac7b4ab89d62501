"""A model checking its own custom metrics on the server's metrics page, as Triton's QA model
custom_metrics does: within one synchronous execute it creates a counter and a histogram, reads the
page over HTTP, updates both, reads the page again. No value() call in between (one would wait for
the server anyway). REPORT: {"after_create": [...], "after_update": [...]}, the expected lines each
page lacked (empty lists when the server applied every operation before execute went on).
"""

import itertools
import json
import urllib.request

import numpy as np

import triton_python_backend_utils as pb_utils

_CALLS = itertools.count(1)


def _page(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _missing(page, lines):
    return [line for line in lines if line not in page]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            url = pb_utils.get_input_tensor_by_name(request, "METRICS_URL").as_numpy().reshape(-1)[0].decode()
            n = next(_CALLS)
            counter = pb_utils.MetricFamily(f"self_check_counter_{n}", "self check", pb_utils.MetricFamily.COUNTER)
            histogram = pb_utils.MetricFamily(f"self_check_histogram_{n}", "self check", pb_utils.MetricFamily.HISTOGRAM)
            c = counter.Metric(labels={"k": "c"})
            h = histogram.Metric(labels={"k": "h"}, buckets=[1.0, 5.0])
            report = {"after_create": _missing(_page(url), [
                f'self_check_counter_{n}{{k="c"}} 0',
                f'self_check_histogram_{n}_count{{k="h"}} 0',
                f'self_check_histogram_{n}_bucket{{k="h",le="1"}} 0',
            ])}
            c.increment(3.0)
            for value in (0.5, 2.0, 7.0):
                h.observe(value)
            report["after_update"] = _missing(_page(url), [
                f'self_check_counter_{n}{{k="c"}} 3',
                f'self_check_histogram_{n}_count{{k="h"}} 3',
                f'self_check_histogram_{n}_sum{{k="h"}} 9.5',
                f'self_check_histogram_{n}_bucket{{k="h",le="1"}} 1',
                f'self_check_histogram_{n}_bucket{{k="h",le="5"}} 2',
                f'self_check_histogram_{n}_bucket{{k="h",le="+Inf"}} 3',
            ])
            text = json.dumps(report).encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([text], np.object_))]))
        return responses
