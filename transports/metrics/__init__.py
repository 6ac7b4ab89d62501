"""Prometheus metrics endpoint (`GET /metrics` on --metrics-port)."""

from kernel.transports.metrics.transport import MetricsTransport

__all__ = ["MetricsTransport"]
