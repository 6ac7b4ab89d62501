"""Per-model-version inference statistics: the numbers behind the statistics
extension (`GET /v2/models/<m>/stats`, gRPC ModelStatistics) and the
`nv_inference_*` Prometheus metrics.

Everything here is plain integer arithmetic on attributes, done on the front
process's event loop when a backend reports a finished execution (once per
batch, not per request) or when the core fails a request itself. Prometheus
objects are built from these numbers only when /metrics is scraped.

Durations are nanoseconds from `time.monotonic_ns()`, which is the same clock
in every process of the machine, so a worker process can stamp the compute
phases and the front process can stamp a request's arrival.
"""

from __future__ import annotations

import time
from typing import Any, Optional

# Why a request failed, as the `reason` label of nv_inference_request_failure says.
REJECTED = "REJECTED"  # timed out (or expired) in a scheduler queue
CANCELED = "CANCELED"  # cancelled while the core held it
BACKEND = "BACKEND"  # the model / its instance failed it
OTHER = "OTHER"  # anything else in the core (ensembles report this)
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)


class ExecutionRecord:
    """One finished execution, in the shape ModelStats.record_execution reads.

    In-process backends build it; the Python backend's worker sends the same
    fields in its Execution message.
    """

    __slots__ = ("batch_size", "start", "input_end", "output_start", "end", "inference_count",
                 "ok_request_ns", "ok_queue_ns", "fail_ns", "merged_batch_size", "lead")

    def __init__(self, batch_size, start, input_end, output_start, end, inference_count, ok_request_ns,
                 ok_queue_ns, fail_ns, merged_batch_size=0, lead=True):
        self.batch_size = batch_size
        self.start = start
        self.input_end = input_end
        self.output_start = output_start
        self.end = end
        self.inference_count = inference_count
        self.ok_request_ns = ok_request_ns
        self.ok_queue_ns = ok_queue_ns
        self.fail_ns = fail_ns
        self.merged_batch_size = merged_batch_size
        self.lead = lead


class ModelStats:
    """Cumulative statistics of one model version since it was loaded."""

    __slots__ = (
        "name",
        "version",
        "success_count",
        "success_ns",
        "fail_count",
        "fail_ns",
        "queue_ns",
        "compute_input_ns",
        "compute_infer_ns",
        "compute_output_ns",
        "inference_count",
        "execution_count",
        "last_inference_ms",
        "batch_stats",
        "failures",
        "observer",
        "load_duration_s",
        "cache_hit_count",
        "cache_hit_ns",
        "cache_miss_count",
        "cache_miss_ns",
    )

    def __init__(self, name: str, version: str):
        self.name = name
        self.version = version
        self.success_count = 0
        self.success_ns = 0  # cumulative request duration of successful requests
        self.fail_count = 0
        self.fail_ns = 0
        self.queue_ns = 0
        self.compute_input_ns = 0
        self.compute_infer_ns = 0
        self.compute_output_ns = 0
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        # batch size -> [executions, compute_input_ns, compute_infer_ns, compute_output_ns]
        self.batch_stats: dict[int, list[int]] = {}
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        # Set when --metrics-config turns on summaries or histograms (kernel.observe.metrics).
        self.observer: Any = None
        self.load_duration_s = 0.0
        # Response cache (kernel.core.cache): lookups answered from the cache and
        # their lookup time; misses and their lookup + insertion time.
        self.cache_hit_count = 0
        self.cache_hit_ns = 0
        self.cache_miss_count = 0
        self.cache_miss_ns = 0

    # ---- recording -----------------------------------------------------------

    def record_execution(self, e) -> None:
        """One execution (a batch) finished in a backend.

        `e` is an ExecutionRecord, or anything with its fields: batch_size,
        start, input_end, output_start, end (monotonic ns), inference_count,
        ok_request_ns, ok_queue_ns (one entry per successful request) and
        fail_ns (one entry per failed request). A batch_size of 0 means the
        backend ran nothing (every request failed before execute).

        merged_batch_size > 0: the record is one share of an execute() that ran several shares'
        requests together (the Python backend merges Executes from several front processes): its
        requests count here as always, the execution itself (execution_count, batch_stats at the
        merged size) only for the share marked `lead`, so that totals over the fronts count it once.
        """
        ok = len(e.ok_request_ns)
        d_in = e.input_end - e.start
        d_infer = e.output_start - e.input_end
        d_out = e.end - e.output_start
        if ok:
            self.success_count += ok
            self.success_ns += sum(e.ok_request_ns)
            self.queue_ns += sum(e.ok_queue_ns)
            self.compute_input_ns += ok * d_in
            self.compute_infer_ns += ok * d_infer
            self.compute_output_ns += ok * d_out
            self.inference_count += e.inference_count
        if e.fail_ns:
            n = len(e.fail_ns)
            self.fail_count += n
            self.fail_ns += sum(e.fail_ns)
            self.failures[BACKEND] += n
        cancelled = getattr(e, "cancelled_ns", None)  # requests their clients cancelled while they ran
        if cancelled:
            n = len(cancelled)
            self.fail_count += n
            self.fail_ns += sum(cancelled)
            self.failures[CANCELED] += n
        bs = e.batch_size
        if e.merged_batch_size:
            if not e.lead:
                if bs > 0:
                    self.last_inference_ms = time.time_ns() // 1_000_000
                bs = 0
            else:
                bs = e.merged_batch_size
        if bs > 0:
            self.execution_count += 1
            self.last_inference_ms = time.time_ns() // 1_000_000
            entry = self.batch_stats.get(bs)
            if entry is None:
                self.batch_stats[bs] = [1, d_in, d_infer, d_out]
            else:
                entry[0] += 1
                entry[1] += d_in
                entry[2] += d_infer
                entry[3] += d_out
        observer = self.observer
        if observer is not None and ok:
            observer.observe(e.ok_request_ns, e.ok_queue_ns, d_in, d_infer, d_out)

    def record_request(
        self,
        success: bool,
        request_ns: int,
        batch_size: int = 1,
        queue_ns: int = 0,
        compute: tuple[int, int, int] = (0, 0, 0),
        reason: str = OTHER,
        execution: bool = True,
    ) -> None:
        """One request handled in the core as a whole (an ensemble request)."""
        if not success:
            self.record_failure(reason, request_ns)
            return
        d_in, d_infer, d_out = compute
        self.success_count += 1
        self.success_ns += request_ns
        self.queue_ns += queue_ns
        self.compute_input_ns += d_in
        self.compute_infer_ns += d_infer
        self.compute_output_ns += d_out
        self.inference_count += batch_size
        if execution:
            self.execution_count += 1
            self.last_inference_ms = time.time_ns() // 1_000_000
            entry = self.batch_stats.setdefault(max(1, batch_size), [0, 0, 0, 0])
            entry[0] += 1
            entry[1] += d_in
            entry[2] += d_infer
            entry[3] += d_out
        if self.observer is not None:
            self.observer.observe((request_ns,), (queue_ns,), d_in, d_infer, d_out)

    def record_cache_hit(self, lookup_ns: int, request_ns: int) -> None:
        """A request answered from the response cache: a success that executed nothing.

        As in Triton, it counts in success (and so in queue, with no queue time)
        but not in inference_count, execution_count or the compute durations.
        """
        self.cache_hit_count += 1
        self.cache_hit_ns += lookup_ns
        self.success_count += 1
        self.success_ns += request_ns
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_cache_miss(self, lookup_and_insert_ns: int) -> None:
        self.cache_miss_count += 1
        self.cache_miss_ns += lookup_and_insert_ns

    def add_cache_insert_ns(self, insert_ns: int) -> None:
        """The insertion time of a miss counted before its entry was stored (the redis cache's)."""
        self.cache_miss_ns += insert_ns

    def record_failure(self, reason: str, duration_ns: int, count: int = 1) -> None:
        self.fail_count += count
        self.fail_ns += duration_ns
        self.failures[reason] = self.failures.get(reason, 0) + count

    # ---- reporting -------------------------------------------------------------

    def to_json(self) -> dict:
        """The statistics extension's `$model_stat` object, field for field."""
        compute_count = self.success_count - self.cache_hit_count  # cache hits computed nothing
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": _dur(self.success_count, self.success_ns),
                "fail": _dur(self.fail_count, self.fail_ns),
                "queue": _dur(self.success_count, self.queue_ns),
                "compute_input": _dur(compute_count, self.compute_input_ns),
                "compute_infer": _dur(compute_count, self.compute_infer_ns),
                "compute_output": _dur(compute_count, self.compute_output_ns),
                "cache_hit": _dur(self.cache_hit_count, self.cache_hit_ns),
                "cache_miss": _dur(self.cache_miss_count, self.cache_miss_ns),
            },
            # Python-backend models report no per-response statistics.
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": bs,
                    "compute_input": _dur(v[0], v[1]),
                    "compute_infer": _dur(v[0], v[2]),
                    "compute_output": _dur(v[0], v[3]),
                }
                for bs, v in sorted(self.batch_stats.items())
            ],
            "memory_usage": [],
        }


def _dur(count: int, ns: int) -> dict:
    return {"count": count, "ns": max(0, ns)}


def batch_size_of(request, max_batch_size: int) -> int:
    """A request's batch size as Triton counts it: dim 0 of its first input, or 1."""
    if max_batch_size > 0 and request.inputs:
        shape = request.inputs[0].shape
        if shape:
            return max(1, shape[0])
    return 1


def now_ns() -> int:
    return time.monotonic_ns()


def fail_request(stats: Optional[ModelStats], request, reason: str) -> None:
    """Count a request the core failed itself (timeout, cancellation, ...)."""
    if stats is not None:
        arrival = request.arrival_ns
        stats.record_failure(reason, time.monotonic_ns() - arrival if arrival else 0)


def merge_statistics(docs: list[dict]) -> dict:
    """Several processes' statistics-extension answers ({"model_stats": [...]}) as one: the first
    document says which versions there are (the process that loaded them); the others' numbers
    for those versions are added in (counts and durations summed per field and per batch size,
    the last inference the latest)."""
    first = docs[0]
    rows = {(r["name"], r["version"]): r for r in first["model_stats"]}
    for doc in docs[1:]:
        for row in doc.get("model_stats", ()):
            total = rows.get((row["name"], row["version"]))
            if total is not None:
                _add_row(total, row)
    return first


def _add_row(total: dict, row: dict) -> None:
    total["last_inference"] = max(total["last_inference"], row["last_inference"])
    total["inference_count"] += row["inference_count"]
    total["execution_count"] += row["execution_count"]
    _add_durations(total["inference_stats"], row["inference_stats"])
    for key, stats in row.get("response_stats", {}).items():
        if key in total["response_stats"]:
            _add_durations(total["response_stats"][key], stats)
        else:
            total["response_stats"][key] = stats
    by_size = {b["batch_size"]: b for b in total["batch_stats"]}
    for b in row["batch_stats"]:
        mine = by_size.get(b["batch_size"])
        if mine is None:
            by_size[b["batch_size"]] = b
        else:
            _add_durations(mine, b)
    total["batch_stats"] = [by_size[size] for size in sorted(by_size)]


def _add_durations(total: dict, part: dict) -> None:
    """Add {"<phase>": {"count": n, "ns": t}, ...} into total (fields that are not durations are left)."""
    for phase, value in part.items():
        if isinstance(value, dict) and "count" in value and "ns" in value:
            mine = total.setdefault(phase, {"count": 0, "ns": 0})
            mine["count"] += value["count"]
            mine["ns"] += value["ns"]
