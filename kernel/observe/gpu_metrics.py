"""Triton's GPU metric families (nv_gpu_*, nv_energy_consumption), one sample per GPU.

Kept apart from kernel.observe.metrics so the NVML side stays out of the request-metrics code;
the readings come from kernel.core.gpu.NvmlReader (or, in tests, a reader built on a fake NVML),
read at scrape time. A machine without GPUs gets no family at all, as with Triton.
"""

from __future__ import annotations

from kernel.core.gpu import GPU_METRIC_FAMILIES


def gpu_families(reader):
    """Prometheus families for what `reader.read()` reports; nothing when reader is None or finds no GPU."""
    readings = reader.read() if reader is not None else []
    if not readings:
        return
    from prometheus_client.metrics_core import Metric
    for name, doc, kind, field in GPU_METRIC_FAMILIES:
        family = Metric(name, doc, kind)
        for r in readings:
            family.add_sample(name, {"gpu_uuid": r.uuid}, getattr(r, field))
        yield family
