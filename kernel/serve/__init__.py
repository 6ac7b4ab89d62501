"""Composition: the `kernel` CLI, the in-process server, the SageMaker entry point.

The only kernel code that imports transports and backends."""
