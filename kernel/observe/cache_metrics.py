"""The response cache's Prometheus families (kernel.core.cache), with tritonserver 2.51's names,
help texts and types, as kernel.observe.metrics builds them at scrape time.

Per model version, for versions whose config enables response_cache (shown even when the server
runs without a cache, as Triton does): hit and miss counts and durations, read from ModelStats.
For the server's cache as a whole, when --cache-config sets one up: utilization, entries, hits,
misses, lookups, evictions and lookup/insertion durations. Triton 2.51 registers these but leaves
all but nv_cache_util at 0 for its local cache; Kernel reports the real numbers. One more family,
kernel_cache_num_rejected_entries, is Kernel's: entries the redis cache read and rejected (issue 31,
N11; always 0 for the local cache, whose entries this process wrote).
"""

from __future__ import annotations


# (family, help, ModelStats count attribute or None, ns attribute or None)
MODEL_COUNTERS = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit_count", None),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds", None, "cache_hit_ns"),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss_count", None),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     None, "cache_miss_ns"),
)

# (family, help, value of a kernel.core.cache.ResponseCache)
SERVER_GAUGES = (
    ("nv_cache_util", "Cache utilization [0.0 - 1.0]", lambda c: c.utilization),
    ("nv_cache_num_entries", "Number of responses stored in response cache", lambda c: c.entries),
    ("nv_cache_num_hits", "Number of cache hits in response cache", lambda c: c.hits),
    ("nv_cache_num_misses", "Number of cache misses in response cache", lambda c: c.misses),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache", lambda c: c.lookups),
    ("nv_cache_num_evictions", "Number of cache evictions in response cache", lambda c: c.evictions),
    ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds",
     lambda c: c.lookup_ns // 1000),
    ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds",
     lambda c: c.insertion_ns // 1000),
    # Kernel's own (no Triton name): entries the redis cache read and did not use (cache_redis_entry).
    ("kernel_cache_num_rejected_entries",
     "Number of stored responses found unusable (malformed, or not matching the model's outputs) and recomputed",
     lambda c: c.rejected),
)


def model_counters() -> dict[str, Metric]:
    """The per-model families, empty (metrics.py adds them to its counters, in Triton's order)."""
    from prometheus_client.metrics_core import Metric

    return {name: Metric(name, doc, "counter") for name, doc, _, _ in MODEL_COUNTERS}


def add_model_samples(counters: dict[str, Metric], model, labels: dict) -> None:
    """This model version's samples, when its config enables the response cache."""
    if not model.config.response_cache.enable:
        return
    s = model.stats
    for name, _, count_attr, ns_attr in MODEL_COUNTERS:
        counters[name].add_sample(name, labels, getattr(s, count_attr) if count_attr else getattr(s, ns_attr) // 1000)


def server_gauges(cache) -> list[Metric]:
    """The server-wide gauges; none without a cache."""
    if cache is None:
        return []
    from prometheus_client.metrics_core import Metric

    out = []
    for name, doc, value in SERVER_GAUGES:
        g = Metric(name, doc, "gauge")
        g.add_sample(name, {}, value(cache))
        out.append(g)
    return out
