"""Observability: Prometheus metrics, request tracing, the server log."""
