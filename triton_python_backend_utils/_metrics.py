"""Custom metrics for model code: ``pb_utils.MetricFamily`` and its ``Metric`` objects.

Names, arguments, kinds and the messages of the errors a model sees follow
Triton's Python backend. The values are owned by the server process, which
shows them on its /metrics endpoint; inside a Kernel worker every operation is
forwarded there by the handler installed as ``_metrics_handler``.

Handler contract (the worker's kernel.backends.python.metrics_client.MetricsClient)::

    family_new(name, description, kind) -> family id     # may raise TritonModelException
    family_delete(family_id)
    metric_new(family_id, kind, labels: dict, buckets: list | None) -> metric id
    metric_delete(metric_id)
    update(metric_id, op, value)                          # op: "increment" | "set" | "observe"
    value(metric_id) -> float

Without a handler (plain Python, unit tests) the values live in this process.
"""

from __future__ import annotations

import enum
import itertools
import threading
import weakref

from . import _hooks as hooks
from ._errors import TritonModelException


# Triton's reason when a histogram's bucket boundaries are not strictly increasing.
UNSORTED_BUCKETS = "Bucket Boundaries must be strictly sorted"


def strictly_sorted(buckets) -> bool:
    return all(a < b for a, b in zip(buckets, buckets[1:]))


def _number(value) -> float:
    """A metric value as Triton's binding converts it: numbers only (a str is a TypeError, not parsed)."""
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError("a metric value must be a number, got " + type(value).__name__)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError("a metric value must be a number, got " + type(value).__name__) from None


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


def _exception(message):
    return TritonModelException(message)


class _LocalHandler:
    """Values kept in this process (no server to forward to)."""

    def __init__(self):
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._families = {}  # name -> kind
        self._metric_keys = {}  # metric id -> (family name, labels key)
        self._values = {}  # (family name, labels key) -> [value, refs]
        self._family_names = {}

    def family_new(self, name, description, kind):
        with self._lock:
            known = self._families.get(name)
            if known is not None and known != kind:
                raise _exception("Error when creating MetricFamily: Family name already exists with different type")
            self._families[name] = kind
            fid = next(self._ids)
            self._family_names[fid] = name
            return fid

    def family_delete(self, family_id):
        self._family_names.pop(family_id, None)

    def metric_new(self, family_id, kind, labels, buckets):
        if buckets is not None and not strictly_sorted(buckets):
            raise _exception("Error when creating Metric: " + UNSORTED_BUCKETS)
        with self._lock:
            key = (self._family_names[family_id], tuple(sorted(labels.items())))
            entry = self._values.setdefault(key, [0.0, 0])
            entry[1] += 1
            mid = next(self._ids)
            self._metric_keys[mid] = key
            return mid

    def metric_delete(self, metric_id):
        with self._lock:
            key = self._metric_keys.pop(metric_id, None)
            entry = self._values.get(key)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    del self._values[key]

    def update(self, metric_id, op, value):
        with self._lock:
            entry = self._values[self._metric_keys[metric_id]]
            if op == "increment":
                entry[0] += value
            elif op == "set":
                entry[0] = value

    def value(self, metric_id):
        with self._lock:
            return self._values[self._metric_keys[metric_id]][0]


_local = _LocalHandler()


def _handler():
    return hooks.metrics_handler() or _local


class Metric:
    """One labelled series of a MetricFamily. Create it with ``family.Metric(labels=..., buckets=...)``."""

    def __init__(self, family, labels, buckets):
        self._kind = family._kind  # no reference to the family: deleting it invalidates this metric
        self._labels = labels
        self._buckets = buckets
        self._cleared = False
        self._id = _handler().metric_new(family._id, self._kind, labels, buckets)

    def _check(self):
        if self._cleared:
            raise _exception(
                "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
                "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have "
                "been deleted."
            )

    def increment(self, value):
        self._check()
        value = _number(value)
        if self._kind == MetricKind.HISTOGRAM:
            raise _exception(
                "Failed to increment metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment"
            )
        if self._kind == MetricKind.COUNTER and value < 0:
            raise _exception(
                "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
                "monotonically by non-negative values."
            )
        _handler().update(self._id, "increment", value)

    def set(self, value):
        self._check()
        value = _number(value)
        if self._kind != MetricKind.GAUGE:
            raise _exception(
                "Failed to set metric value: TRITONSERVER_METRIC_KIND_%s does not support Set" % self._kind.name
            )
        _handler().update(self._id, "set", value)

    def observe(self, value):
        self._check()
        value = _number(value)
        if self._kind != MetricKind.HISTOGRAM:
            raise _exception(
                "Failed to observe metric value: TRITONSERVER_METRIC_KIND_%s does not support Observe"
                % self._kind.name
            )
        _handler().update(self._id, "observe", value)

    def value(self):
        self._check()
        if self._kind == MetricKind.HISTOGRAM:
            raise _exception(
                "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"
            )
        return _handler().value(self._id)

    def _clear(self):
        if not self._cleared:
            self._cleared = True
            try:
                _handler().metric_delete(self._id)
            except Exception:  # noqa: BLE001 - best effort while tearing down
                pass

    def __del__(self):
        self._clear()


class MetricFamily:
    """A named metric family. ``kind`` is MetricFamily.COUNTER, GAUGE or HISTOGRAM.

    Creating a family whose name already exists with the same kind refers to
    the existing family (its first description is kept); with another kind it
    is an error.
    """

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name, description, kind):
        if name is None or description is None or kind is None:
            raise TypeError("MetricFamily(): name, description and kind must not be None")
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily(): name and description must be str")
        if not isinstance(kind, MetricKind):
            # Triton's binding takes the MetricFamily.<KIND> constants only, not plain ints.
            raise TypeError("MetricFamily(): 'kind' must be MetricFamily.COUNTER, GAUGE or HISTOGRAM, got "
                            + repr(kind))
        self._name = name
        self._description = description
        self._kind = kind
        self._metrics = []
        self._id = None
        self._id = _handler().family_new(name, description, int(kind))

    def Metric(self, labels=None, buckets=None):  # noqa: N802 - Triton's method name
        if labels is not None and not isinstance(labels, dict):
            raise _exception("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise _exception("Failed to create metric. Buckets must be a list.")
            if self._kind in (MetricKind.COUNTER, MetricKind.GAUGE):
                raise _exception("Failed to create metric. Unexpected buckets found.")
            try:
                buckets = [float(b) for b in buckets]
            except (TypeError, ValueError):
                # Triton's binding fails to convert the list to its C++ doubles: a RuntimeError there too.
                raise RuntimeError("Failed to create metric: buckets must be numbers") from None
        elif self._kind == MetricKind.HISTOGRAM:
            raise _exception("Failed to create metric. Missing required buckets.")
        labels = {str(k): v for k, v in (labels or {}).items()}
        for key, value in labels.items():
            if not isinstance(value, str):
                raise _exception("Error when creating Metric: attempt to access JSON non-string as string")
        metric = Metric(self, labels, buckets)
        self._metrics.append(_WeakMetric(metric))
        return metric

    def __del__(self):
        if getattr(self, "_id", None) is None:
            return
        for ref in self._metrics:
            metric = ref()
            if metric is not None:
                metric._clear()
        try:
            _handler().family_delete(self._id)
        except Exception:  # noqa: BLE001
            pass


def _WeakMetric(metric):  # noqa: N802
    return weakref.ref(metric)
