"""Metrics totalled over the processes of a server with several fronts (kernel.serve.fronts).

Each front counts the requests it handled in its own ModelStats (and latency observers); the
supervisor serves the metrics port and adds every front's families to its own at scrape time, so
the port gives one answer for the whole server. Counters, gauges (pending, in flight, cache
sizes) and histogram buckets, sums and counts add up. Two kinds do not: a summary's quantiles,
where the highest of the processes' is given (a bound on the whole server's, not its exact
quantile), and the model load time, which every front repeats from the supervisor's load.
"""

from __future__ import annotations

from typing import Any, Iterable

# Families whose value every process reports the same: the total is that value, not a sum.
SAME_EVERYWHERE = frozenset({"nv_model_load_duration_secs"})


def families_data(metrics: Iterable) -> list:
    """prometheus_client Metric objects as plain data that crosses a process boundary."""
    return [[m.name, m.documentation, m.type, [[s.name, dict(s.labels), float(s.value)] for s in m.samples]]
            for m in metrics]


def merge(local: list, others: list[list]) -> list:
    """The supervisor's Metric objects with every front's families (families_data) added in."""
    from prometheus_client.metrics_core import Metric

    out: dict[str, Any] = {}
    samples: dict[str, dict] = {}
    for m in local:
        out[m.name] = (m.name, m.documentation, m.type)
        samples[m.name] = {(s.name, _key(s.labels)): [s.name, dict(s.labels), s.value] for s in m.samples}
    for families in others:
        for name, doc, kind, rows in families:
            if name not in out:
                out[name] = (name, doc, kind)
                samples[name] = {}
            mine = samples[name]
            for sample_name, labels, value in rows:
                key = (sample_name, _key(labels))
                have = mine.get(key)
                if have is None:
                    mine[key] = [sample_name, labels, value]
                elif "quantile" in labels or name in SAME_EVERYWHERE:
                    have[2] = max(have[2], value)
                else:
                    have[2] += value
    merged = []
    for name, (fname, doc, kind) in out.items():
        metric = Metric(fname, doc, kind)
        for sample_name, labels, value in samples[name].values():
            metric.add_sample(sample_name, labels, value)
        merged.append(metric)
    return merged


def _key(labels: dict) -> tuple:
    return tuple(sorted(labels.items()))
