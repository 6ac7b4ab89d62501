"""Custom metrics that models create (pb_utils.MetricFamily / Metric): counters, gauges and
histograms, shared by every instance that names them, with Triton's errors."""

from __future__ import annotations

import re
from typing import Iterable


from kernel.observe.distributions import Histogram, add_histogram

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2  # pb_utils.MetricFamily kinds
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_KIND_TYPE = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}


class MetricError(Exception):
    """A custom-metric operation the model must see fail (message as Triton words it)."""


class _Child:
    __slots__ = ("value", "hist", "refs")

    def __init__(self, buckets) -> None:
        self.value = 0.0
        self.hist = Histogram(buckets) if buckets is not None else None
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
        from prometheus_client.metrics_core import Metric

        out = []
        wanted = set(kinds)
        for family in self.families.values():
            if family.kind not in wanted or not family.children:
                continue
            m = Metric(family.name, family.description, _KIND_TYPE[family.kind])
            for key, child in family.children.items():
                labels = dict(key)
                if child.hist is not None:
                    add_histogram(m, family.name, labels, child.hist)
                else:
                    m.add_sample(family.name, labels, child.value)
            out.append(m)
        return out
