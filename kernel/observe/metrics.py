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

import logging
from typing import Iterable, Optional


from kernel.core import stats as st
from kernel.core.gpu import NvmlReader
from kernel.core.scheduling import in_flight_count
from kernel.observe.gpu_metrics import gpu_families
from kernel.observe import cache_metrics, metrics_totals, openai_metrics
from kernel.observe.custom_metrics import COUNTER, GAUGE, HISTOGRAM, CustomMetrics
from kernel.observe.distributions import SUMMARIES, LatencyObserver, add_histogram, add_summary, format_value

log = logging.getLogger("kernel.core.server")

DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
FIRST_RESPONSE_HISTOGRAM = "nv_inference_first_response_histogram_ms"
DEFAULT_FIRST_RESPONSE_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)
# Kernel's own, kept with the first-response histogram (histogram_latencies=true): the time between
# two responses of one request that carry data (a streaming model's tokens). Its buckets are a
# streaming model's scale, milliseconds per token; model_metrics can set them as for the other family.
INTER_RESPONSE_HISTOGRAM = "nv_inference_inter_response_histogram_ms"
DEFAULT_INTER_RESPONSE_BUCKETS = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)
# Kernel's own gauge beside Triton's pending count: requests accepted and not finished (queued or
# executing; a stream until its last response), what an autoscaler of streaming models scales on.
INFLIGHT_GAUGE = "nv_inference_inflight_request_count"


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
        inter_buckets = DEFAULT_INTER_RESPONSE_BUCKETS
        for control in model.config.model_metrics.metric_control:
            if control.metric_identifier.family == FIRST_RESPONSE_HISTOGRAM:
                buckets = tuple(control.histogram_options.buckets)
            elif control.metric_identifier.family == INTER_RESPONSE_HISTOGRAM:
                inter_buckets = tuple(control.histogram_options.buckets)
            else:
                log.warning(
                    "Metric family '%s' in 'metric_identifier' is not a customizable metric in Triton core.",
                    control.metric_identifier.family,
                )
        return LatencyObserver(
            self.quantiles if self.summary_latencies else None,
            buckets if self.histogram_latencies else None,
            inter_buckets,
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


class ServerCollector:
    """Builds the `nv_*` families from the server's statistics at scrape time (a prometheus_client
    collector: `collect()`; prometheus_client itself is imported by the first scrape, not at start-up)."""

    def __init__(self, server, config: MetricsConfig, cpu: Optional[CpuSampler], gpu=None) -> None:
        self.server = server
        self.config = config
        self.cpu = cpu
        self.gpu = gpu  # .read() -> kernel.core.gpu.GpuReading list

    def collect(self):
        from prometheus_client.metrics_core import Metric

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
        inflight = Metric(INFLIGHT_GAUGE, "Instantaneous number of requests accepted and not yet finished "
                          "(queued or executing, a stream until its last response) per-model.", "gauge")
        load_time = Metric("nv_model_load_duration_secs", "Model load time in seconds", "gauge")
        first = (Metric(FIRST_RESPONSE_HISTOGRAM, "Duration from request to first response in milliseconds",
                        "histogram") if self.config.histogram_latencies else None)
        gaps = (Metric(INTER_RESPONSE_HISTOGRAM, "Duration between two responses of a request that carry data, "
                       "in milliseconds", "histogram") if self.config.histogram_latencies else None)
        summaries = ([Metric(name, doc, "summary") for name, doc in SUMMARIES]
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
            inflight.add_sample(INFLIGHT_GAUGE, labels, in_flight_count(m))
            load_time.add_sample("nv_model_load_duration_secs", labels, s.load_duration_s)
            observer = s.observer
            if observer is not None:
                if first is not None and observer.first_response is not None:
                    add_histogram(first, FIRST_RESPONSE_HISTOGRAM, labels, observer.first_response)
                if gaps is not None and observer.inter_response is not None:
                    add_histogram(gaps, INTER_RESPONSE_HISTOGRAM, labels, observer.inter_response)
                if summaries is not None and observer.summaries is not None:
                    for metric, summary in zip(summaries, observer.summaries):
                        add_summary(metric, metric.name, labels, summary)
        yield from (c for c in counters.values() if c.samples)
        yield from custom.collect((COUNTER,))
        for g in (pending, inflight, load_time):
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
        if gaps is not None and gaps.samples:
            yield gaps
        yield from custom.collect((HISTOGRAM,))
        yield from openai_metrics.families(self.server, model_labels)  # the OpenAI API's tokens and latencies
        if summaries is not None:
            yield from (s for s in summaries if s.samples)



def model_labels(model) -> dict[str, str]:
    labels = {"model": model.name, "version": model.version_str}
    for key, value in model.config.metric_tags.items():
        labels["_" + key] = value
    return labels


# --------------------------------------------------------------------------- text exposition


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
            out.append(f"{sample.name}{_labels(sample.labels)} {format_value(sample.value)}\n")
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
        self.collector = ServerCollector(server, self.config, self.cpu, gpu)
        self._timer = None
        # With several front processes, the supervisor's: async () -> every front's families
        # (kernel.observe.metrics_totals.families_data lists), added in by total_text().
        self.others = None

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
        return render(self.collector.collect())

    async def total_text(self) -> str:
        """The whole server's text: this process's alone, or with several front processes the
        totals over all of them (kernel.observe.metrics_totals): a front asks the supervisor
        (server.peers), the supervisor adds what `others()` gathers from the fronts."""
        peers = getattr(self.server, "peers", None)
        if peers is not None:
            return await peers.metrics_text()
        if self.others is None:
            return self.text()
        return render(metrics_totals.merge(list(self.collector.collect()), await self.others()))


def front_families(server) -> list:
    """A front's own model families, as data for the supervisor's totals (no CPU, GPU or custom
    metrics: those are the supervisor's)."""
    return metrics_totals.families_data(ServerCollector(server, server.metrics_config, None, None).collect())

