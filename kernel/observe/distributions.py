"""Latency distributions for the metrics endpoint: Triton's summaries (quantiles over a sliding
window) and histograms, and the per-model observer that feeds them when --metrics-config asks."""

from __future__ import annotations

import bisect
import math
import random
import time
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

from kernel.core import stats as st

SUMMARIES = (
    ("nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)"),
    ("nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)"),
    ("nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
)


class Summary:
    """Quantiles over a sliding window (60 s in 5 rotating buckets), plus all-time count and sum.

    Each age bucket keeps a bounded uniform sample of what it saw, so memory
    stays flat under any load; quantiles are read off the merged samples.
    """

    __slots__ = ("quantiles", "count", "sum", "_buckets", "_seen", "_rotated")

    MAX_AGE_S = 60.0
    AGE_BUCKETS = 5
    SAMPLE = 2048

    def __init__(self, quantiles) -> None:
        self.quantiles = quantiles
        self.count = 0
        self.sum = 0.0
        self._buckets: list[list[float]] = [[] for _ in range(self.AGE_BUCKETS)]
        self._seen = [0] * self.AGE_BUCKETS
        self._rotated = time.monotonic()

    def _rotate(self) -> None:
        step = self.MAX_AGE_S / self.AGE_BUCKETS
        now = time.monotonic()
        while now - self._rotated >= step:
            self._rotated += step
            self._buckets.pop(0)
            self._buckets.append([])
            self._seen.pop(0)
            self._seen.append(0)

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        self._rotate()
        bucket = self._buckets[-1]
        self._seen[-1] += 1
        if len(bucket) < self.SAMPLE:
            bucket.append(value)
        else:
            j = random.randrange(self._seen[-1])
            if j < self.SAMPLE:
                bucket[j] = value

    def values(self) -> list[tuple[float, float]]:
        self._rotate()
        merged = sorted(v for b in self._buckets for v in b)
        out = []
        for q, _ in self.quantiles:
            if not merged:
                out.append((q, math.nan))
            else:
                out.append((q, merged[min(len(merged) - 1, max(0, math.ceil(q * len(merged)) - 1))]))
        return out


class Histogram:
    __slots__ = ("bounds", "counts", "count", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = sorted(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        out = []
        running = 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            out.append((format_value(bound), running))
        out.append(("+Inf", self.count))
        return out


class LatencyObserver:
    """Per-model latency summaries, first-response and inter-response histograms (only when configured).

    The inter-response histogram (Kernel's own) is what an autoscaler of a streaming model needs
    beside the time to first response: the time between two responses of one request that carry
    data (a decoupled model's tokens), in milliseconds. It is kept whenever the first-response
    histogram is, at no extra cost for models that answer once."""

    __slots__ = ("summaries", "first_response", "inter_response")

    def __init__(self, quantiles, buckets, inter_buckets=None) -> None:
        self.summaries = [Summary(quantiles) for _ in SUMMARIES] if quantiles else None
        self.first_response = Histogram(buckets) if buckets is not None else None
        self.inter_response = Histogram(inter_buckets) if buckets is not None and inter_buckets is not None else None

    def observe(self, request_ns, queue_ns, d_in: int, d_infer: int, d_out: int) -> None:
        s = self.summaries
        if s is None:
            return
        for v in request_ns:
            s[0].observe(v // 1000)
        for v in queue_ns:
            s[1].observe(v // 1000)
        for _ in range(len(request_ns)):
            s[2].observe(d_in // 1000)
            s[3].observe(d_infer // 1000)
            s[4].observe(d_out // 1000)

    def watch_first_response(self, request) -> None:
        """Time from arrival to the first response of `request`, and between its later responses
        that carry data (wraps its callback)."""
        hist = self.first_response
        gaps = self.inter_response
        deliver = request.on_response
        last = [request.arrival_ns, False]  # when the previous response came; whether one came

        def on_response(response) -> None:
            if response.error is None:
                if not last[1]:
                    last[1] = True
                    now = st.now_ns()
                    hist.observe((now - last[0]) / 1e6)
                    last[0] = now
                elif gaps is not None and (response.outputs or not response.final):  # not a bare final flag
                    now = st.now_ns()
                    gaps.observe((now - last[0]) / 1e6)
                    last[0] = now
            elif not last[1]:
                last[1] = True  # an error first: no first response to time
            deliver(response)

        request.on_response = on_response


# ---- samples for the Prometheus collectors


def format_value(value) -> str:
    """A sample value as the Prometheus text format writes it."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.16g}"


def add_histogram(metric: Metric, name: str, labels: dict, hist: "Histogram") -> None:
    metric.add_sample(name + "_count", labels, hist.count)
    metric.add_sample(name + "_sum", labels, hist.sum)
    for le, n in hist.cumulative():
        metric.add_sample(name + "_bucket", {**labels, "le": le}, n)


def add_summary(metric: Metric, name: str, labels: dict, summary: "Summary") -> None:
    metric.add_sample(name + "_count", labels, summary.count)
    metric.add_sample(name + "_sum", labels, summary.sum)
    for q, v in summary.values():
        metric.add_sample(name, {**labels, "quantile": format_value(q)}, v)
