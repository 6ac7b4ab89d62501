"""The serving core: requests, models, registry, schedulers, statistics, shared memory and the
interfaces transports and backends plug into. It imports nothing above it."""
