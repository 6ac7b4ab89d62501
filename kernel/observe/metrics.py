"""Prometheus metrics: Triton's `nv_*` families, CPU gauges and models' custom metrics.

Nothing here runs per request. The per-model numbers live in kernel.core.stats
(plain integers updated once per executed batch); the `nv_inference_*`
families are built from them when /metrics is scraped, through a
prometheus_client Collector. Only when `--metrics-config` turns on latency
summaries or the first-response histogram does a model get an observer that
records individual requests.

Custom metrics (`pb_utils.MetricFamily` in model code) live here too: the
worker processes forward their operations, this process owns the values.

The text exposition is written here rather than with
prometheus_client.generate_latest because Triton's metrics (prometheus-cpp)
are not OpenMetrics-munged: counters keep their names (no `_total` suffix)
and `# TYPE` lines name the family as registered. Dashboards and clients match
these names literally.
"""

from __future__ import annotations

import bisect
import logging
import math
import random
import re
import time
from typing import Iterable, Optional

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from kernel.core import stats as st
from kernel.core.gpu import NvmlReader
from kernel.observe.gpu_metrics import gpu_families
from kernel.observe import cache_metrics

log = logging.getLogger("kernel.core.server")

DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
FIRST_RESPONSE_HISTOGRAM = "nv_inference_first_response_histogram_ms"
DEFAULT_FIRST_RESPONSE_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2  # pb_utils.MetricFamily kinds
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_KIND_TYPE = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}

# (family, help) of Triton's per-model families, in registration order.
_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)"),
)
_LATENCY_COUNTERS = (
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)", "success_ns"),
    ("nv_inference_queue_duration_us",
     "Cumulative inference queuing duration in microseconds (includes cached requests)", "queue_ns"),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)", "compute_input_ns"),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     "compute_infer_ns"),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     "compute_output_ns"),
)
_SUMMARIES = (
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


# --------------------------------------------------------------------------- --metrics-config


class MetricsConfig:
    """`--metrics-config` settings (the global group; `<group>,<key>=<value>` groups are kept)."""

    def __init__(self, settings: Optional[dict[str, str]] = None) -> None:
        self.counter_latencies = True
        self.summary_latencies = False
        self.histogram_latencies = False
        self.quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
        for key, value in (settings or {}).items():
            if key == "counter_latencies":
                self.counter_latencies = value.strip().lower() != "false"
            elif key == "summary_latencies":
                self.summary_latencies = value.strip().lower() == "true"
            elif key == "histogram_latencies":
                self.histogram_latencies = value.strip().lower() == "true"
            elif key == "summary_quantiles":
                parsed = parse_quantiles(value)
                if parsed:
                    self.quantiles = parsed
            else:
                log.warning("--metrics-config: unknown setting '%s' ignored", key)

    def observer_for(self, model) -> Optional["LatencyObserver"]:
        if not (self.summary_latencies or self.histogram_latencies):
            return None
        buckets = DEFAULT_FIRST_RESPONSE_BUCKETS
        for control in model.config.model_metrics.metric_control:
            if control.metric_identifier.family == FIRST_RESPONSE_HISTOGRAM:
                buckets = tuple(control.histogram_options.buckets)
            else:
                log.warning(
                    "Metric family '%s' in 'metric_identifier' is not a customizable metric in Triton core.",
                    control.metric_identifier.family,
                )
        return LatencyObserver(
            self.quantiles if self.summary_latencies else None,
            buckets if self.histogram_latencies else None,
        )


def parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """"0.5:0.05,0.9:0.01" -> ((0.5, 0.05), (0.9, 0.01)); bad items are logged and skipped."""
    out = []
    for item in text.strip().strip('"').split(","):
        if not item:
            continue
        q, sep, err = item.partition(":")
        if not sep:
            log.error("Invalid option: [%s]. No ':' delimiter found. Expected format is <quantile>:<error>", item)
            continue
        try:
            out.append((float(q), float(err)))
        except ValueError as exc:
            log.error("Invalid option: [%s]. Error: %s", item, exc)
    return tuple(out)


# --------------------------------------------------------------------------- summaries, histograms


class _Summary:
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


class _Histogram:
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
            out.append((_fmt(bound), running))
        out.append(("+Inf", self.count))
        return out


class LatencyObserver:
    """Per-model latency summaries / first-response histogram (only when configured)."""

    __slots__ = ("summaries", "first_response")

    def __init__(self, quantiles, buckets) -> None:
        self.summaries = [_Summary(quantiles) for _ in _SUMMARIES] if quantiles else None
        self.first_response = _Histogram(buckets) if buckets is not None else None

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
        """Time from arrival to the first response of `request` (wraps its callback)."""
        hist = self.first_response
        deliver = request.on_response
        arrival = request.arrival_ns
        seen = [False]

        def on_response(response) -> None:
            if not seen[0]:
                seen[0] = True
                if response.error is None:
                    hist.observe((st.now_ns() - arrival) / 1e6)
            deliver(response)

        request.on_response = on_response


# --------------------------------------------------------------------------- custom metrics


class MetricError(Exception):
    """A custom-metric operation the model must see fail (message as Triton words it)."""


class _Child:
    __slots__ = ("value", "hist", "refs")

    def __init__(self, buckets) -> None:
        self.value = 0.0
        self.hist = _Histogram(buckets) if buckets is not None else None
        self.refs = 0


class _Family:
    __slots__ = ("name", "description", "kind", "children", "refs")

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.children: dict[tuple, _Child] = {}
        self.refs = 0


class CustomMetrics:
    """Metric families created by models, shared by every instance that names them.

    Handles are (owner, id): the owner is the worker instance that created the
    object, the id its own number for it, so a worker never waits for a handle.
    Same family name and kind: the same family (first description wins); same
    labels in a family: the same metric. A metric disappears from /metrics when
    the last handle to it is deleted (or its worker goes away).
    """

    def __init__(self) -> None:
        self.families: dict[str, _Family] = {}
        self._family_handles: dict[tuple, _Family] = {}
        self._metric_handles: dict[tuple, tuple[_Family, tuple]] = {}

    def family_new(self, owner, fid: int, name: str, description: str, kind: int) -> None:
        if kind not in _KIND_TYPE:
            raise MetricError("Unsupported kind passed to MetricFamily constructor.")
        if not _METRIC_NAME.match(name):
            raise MetricError("Invalid metric name")
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = _Family(name, description, kind)
        elif family.kind != kind:
            raise MetricError("Family name already exists with different type")
        family.refs += 1
        self._family_handles[(id(owner), fid)] = family

    def metric_new(self, owner, mid: int, fid: int, labels: dict[str, str], buckets) -> None:
        family = self._family_handles.get((id(owner), fid))
        if family is None:
            raise MetricError("Could not find the metric family of this metric")
        if family.kind == HISTOGRAM and buckets is None:
            raise MetricError("Bucket boundaries not found in Metric args.")
        if family.kind != HISTOGRAM and buckets is not None:
            kind = "counter" if family.kind == COUNTER else "gauge"
            raise MetricError(f"Unexpected args found in {kind} Metric constructor.")
        key = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        for k, _ in key:
            if not _LABEL_NAME.match(k) or k.startswith("__"):
                raise MetricError("Invalid label name")
        child = family.children.get(key)
        if child is None:
            child = family.children[key] = _Child(buckets)
        child.refs += 1
        self._metric_handles[(id(owner), mid)] = (family, key)

    def _child(self, owner, mid: int, what: str) -> tuple[_Family, _Child]:
        found = self._metric_handles.get((id(owner), mid))
        child = found[0].children.get(found[1]) if found else None
        if child is None:
            raise MetricError(f"Could not {what} metric value. Metric has been invalidated.")
        return found[0], child

    def increment(self, owner, mid: int, value: float) -> None:
        family, child = self._child(owner, mid, "increment")
        if family.kind == COUNTER and value < 0:
            raise MetricError(
                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."
            )
        if family.kind == HISTOGRAM:
            raise MetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")
        child.value += value

    def set(self, owner, mid: int, value: float) -> None:
        family, child = self._child(owner, mid, "set")
        if family.kind != GAUGE:
            raise MetricError(f"TRITONSERVER_METRIC_KIND_{_KIND_TYPE[family.kind].upper()} does not support Set")
        child.value = value

    def observe(self, owner, mid: int, value: float) -> None:
        family, child = self._child(owner, mid, "set")
        if family.kind != HISTOGRAM:
            raise MetricError(
                f"TRITONSERVER_METRIC_KIND_{_KIND_TYPE[family.kind].upper()} does not support Observe"
            )
        child.hist.observe(value)

    def value(self, owner, mid: int) -> float:
        family, child = self._child(owner, mid, "get")
        if family.kind == HISTOGRAM:
            raise MetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")
        return child.value

    def metric_delete(self, owner, mid: int) -> None:
        found = self._metric_handles.pop((id(owner), mid), None)
        if found is None:
            return
        family, key = found
        child = family.children.get(key)
        if child is not None:
            child.refs -= 1
            if child.refs <= 0:
                del family.children[key]

    def family_delete(self, owner, fid: int) -> None:
        family = self._family_handles.pop((id(owner), fid), None)
        if family is not None:
            family.refs -= 1  # the family stays registered (as in Triton); empty ones are not shown

    def drop_owner(self, owner) -> None:
        """A worker went away: its handles die with it."""
        oid = id(owner)
        for key in [k for k in self._metric_handles if k[0] == oid]:
            self.metric_delete(owner, key[1])
        for key in [k for k in self._family_handles if k[0] == oid]:
            self.family_delete(owner, key[1])

    def collect(self, kinds: Iterable[int]) -> list[Metric]:
        out = []
        wanted = set(kinds)
        for family in self.families.values():
            if family.kind not in wanted or not family.children:
                continue
            m = Metric(family.name, family.description, _KIND_TYPE[family.kind])
            for key, child in family.children.items():
                labels = dict(key)
                if child.hist is not None:
                    _add_histogram(m, family.name, labels, child.hist)
                else:
                    m.add_sample(family.name, labels, child.value)
            out.append(m)
        return out


# --------------------------------------------------------------------------- Triton's families


class CpuSampler:
    """nv_cpu_utilization / nv_cpu_memory_*: sampled every --metrics-interval-ms from /proc."""

    def __init__(self) -> None:
        self.utilization = 0.0
        self.mem_total = 0.0
        self.mem_used = 0.0
        self._last: Optional[tuple[int, int]] = None

    def poll(self) -> None:
        try:
            with open("/proc/stat", "rb") as f:
                fields = f.readline().split()[1:]
            values = [int(x) for x in fields[:8]] + [0] * max(0, 8 - len(fields))
            user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
            busy = user + nice + system + irq + softirq + steal
            idle_all = idle + iowait
            if self._last is not None:
                d_busy = busy - self._last[0]
                d_idle = idle_all - self._last[1]
                total = d_busy + d_idle
                self.utilization = d_busy / total if total > 0 else 0.0
            self._last = (busy, idle_all)
        except (OSError, ValueError):
            self.utilization = 0.0
        try:
            info = {}
            with open("/proc/meminfo", "rb") as f:
                for line in f:
                    key, _, rest = line.partition(b":")
                    parts = rest.split()
                    if parts:
                        info[key.decode()] = int(parts[0]) * 1024
            self.mem_total = float(info.get("MemTotal", 0))
            self.mem_used = float(info.get("MemTotal", 0) - info.get("MemAvailable", 0))
        except (OSError, ValueError):
            self.mem_total = self.mem_used = 0.0


class ServerCollector(Collector):
    """Builds the `nv_*` families from the server's statistics at scrape time."""

    def __init__(self, server, config: MetricsConfig, cpu: Optional[CpuSampler], gpu=None) -> None:
        self.server = server
        self.config = config
        self.cpu = cpu
        self.gpu = gpu  # .read() -> kernel.core.gpu.GpuReading list

    def collect(self):
        models = [m for m in self.server.registry.all_models() if m.ready]
        custom: CustomMetrics = self.server.custom_metrics
        counters: dict[str, Metric] = {}
        for name, doc in _COUNTERS:
            counters[name] = Metric(name, doc, "counter")
        if self.config.counter_latencies:
            for name, doc, _ in _LATENCY_COUNTERS:
                counters[name] = Metric(name, doc, "counter")
        counters.update(cache_metrics.model_counters())
        pending = Metric("nv_inference_pending_request_count",
                         "Instantaneous number of pending requests awaiting execution per-model.", "gauge")
        load_time = Metric("nv_model_load_duration_secs", "Model load time in seconds", "gauge")
        first = (Metric(FIRST_RESPONSE_HISTOGRAM, "Duration from request to first response in milliseconds",
                        "histogram") if self.config.histogram_latencies else None)
        summaries = ([Metric(name, doc, "summary") for name, doc in _SUMMARIES]
                     if self.config.summary_latencies else None)
        for m in models:
            s = m.stats
            labels = model_labels(m)
            counters["nv_inference_request_success"].add_sample("nv_inference_request_success", labels,
                                                                 s.success_count)
            for reason in st.FAILURE_REASONS:
                counters["nv_inference_request_failure"].add_sample(
                    "nv_inference_request_failure", {**labels, "reason": reason}, s.failures.get(reason, 0))
            counters["nv_inference_count"].add_sample("nv_inference_count", labels, s.inference_count)
            counters["nv_inference_exec_count"].add_sample("nv_inference_exec_count", labels, s.execution_count)
            if self.config.counter_latencies:
                for name, _, attr in _LATENCY_COUNTERS:
                    counters[name].add_sample(name, labels, getattr(s, attr) // 1000)
            cache_metrics.add_model_samples(counters, m, labels)
            scheduler = m.scheduler
            pending.add_sample("nv_inference_pending_request_count", labels,
                               scheduler.pending_count() if scheduler is not None else 0)
            load_time.add_sample("nv_model_load_duration_secs", labels, s.load_duration_s)
            observer = s.observer
            if observer is not None:
                if first is not None and observer.first_response is not None:
                    _add_histogram(first, FIRST_RESPONSE_HISTOGRAM, labels, observer.first_response)
                if summaries is not None and observer.summaries is not None:
                    for metric, summary in zip(summaries, observer.summaries):
                        _add_summary(metric, metric.name, labels, summary)
        yield from (c for c in counters.values() if c.samples)
        yield from custom.collect((COUNTER,))
        for g in (pending, load_time):
            if g.samples:
                yield g
        yield from cache_metrics.server_gauges(getattr(self.server, "response_cache", None))
        if self.cpu is not None:
            for name, doc, value in (
                ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", self.cpu.utilization),
                ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", self.cpu.mem_total),
                ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", self.cpu.mem_used),
            ):
                g = Metric(name, doc, "gauge")
                g.add_sample(name, {}, value)
                yield g
        yield from gpu_families(self.gpu)
        yield from custom.collect((GAUGE,))
        if first is not None and first.samples:
            yield first
        yield from custom.collect((HISTOGRAM,))
        if summaries is not None:
            yield from (s for s in summaries if s.samples)



def model_labels(model) -> dict[str, str]:
    labels = {"model": model.name, "version": model.version_str}
    for key, value in model.config.metric_tags.items():
        labels["_" + key] = value
    return labels


def _add_histogram(metric: Metric, name: str, labels: dict, hist: _Histogram) -> None:
    metric.add_sample(name + "_count", labels, hist.count)
    metric.add_sample(name + "_sum", labels, hist.sum)
    for le, n in hist.cumulative():
        metric.add_sample(name + "_bucket", {**labels, "le": le}, n)


def _add_summary(metric: Metric, name: str, labels: dict, summary: _Summary) -> None:
    metric.add_sample(name + "_count", labels, summary.count)
    metric.add_sample(name + "_sum", labels, summary.sum)
    for q, v in summary.values():
        metric.add_sample(name, {**labels, "quantile": _fmt(q)}, v)


# --------------------------------------------------------------------------- text exposition


def _fmt(value) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.16g}"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    special = [k for k in ("le", "quantile") if k in labels]
    keys = sorted(k for k in labels if k not in special) + special
    return "{" + ",".join(f'{k}="{_escape_label(str(labels[k]))}"' for k in keys) + "}"


def render(metrics: Iterable[Metric]) -> str:
    """Prometheus text format (0.0.4), names exactly as registered."""
    out: list[str] = []
    for m in metrics:
        out.append(f"# HELP {m.name} {_escape_help(m.documentation)}\n")
        out.append(f"# TYPE {m.name} {m.type}\n")
        for sample in m.samples:
            out.append(f"{sample.name}{_labels(sample.labels)} {_fmt(sample.value)}\n")
    return "".join(out)


class MetricsService:
    """What the metrics transport serves: the registry and its text form."""

    def __init__(self, server, config: Optional[MetricsConfig] = None, cpu_metrics: bool = True,
                 interval_ms: int = 2000, gpu_reader=None, gpu_metrics: bool = True) -> None:
        self.server = server
        self.config = config or MetricsConfig()
        self.cpu = CpuSampler() if cpu_metrics else None
        self.interval_s = max(1, interval_ms) / 1000.0
        gpu = (gpu_reader or NvmlReader()) if gpu_metrics else None  # --allow-gpu-metrics
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServerCollector(server, self.config, self.cpu, gpu))
        self._timer = None

    def start_polling(self, loop) -> None:
        if self.cpu is None:
            return

        def tick() -> None:
            self.cpu.poll()
            self._timer = loop.call_later(self.interval_s, tick)

        tick()

    def stop_polling(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def text(self) -> str:
        return render(self.registry.collect())

