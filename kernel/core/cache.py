"""The response cache: Triton's `local` cache (`--cache-config local,size=BYTES`); its `redis`
cache, which several servers share, is kernel.core.cache_redis.

A model opts in with `response_cache { enable: true }` in its config. The core
looks a request up before it reaches the model's scheduler (Server.submit): a
hit is answered from here and the model never sees it; a miss runs as usual and
its response is stored on the way back to the client.

Why it lives in the core and works this way:

- The key (kernel.core.cache_key) is everything of a request that reaches the model: the model
  version, every input's name, datatype, shape and bytes (in name order), the request parameters,
  correlation id and flags; not the request id, priority, timeout or requested outputs. The
  version is named by its ModelStats object, which each load creates anew: a reloaded model
  never answers from its previous load's entries, and an in-flight miss of an unloaded version
  cannot store an entry that a new load would hit. tritonserver 2.51 leaves the parameters out
  (a model that reads them got another request's answer); Kernel keeps them in. The key holds an
  input's bytes themselves up to 64 KiB, and the SHA-256 digest of a larger one (as the Redis
  cache's key does): two requests share an entry only if their inputs are the same bytes or
  collide in SHA-256. A request with more than 2 MiB of inputs has its key hashed on a thread
  before it is admitted (kernel.core.admission, in order with the model's other requests), and
  a response with more than 2 MiB of outputs is copied into its entry on a thread before it goes
  on to its client: on the loop, one 256 MiB request held every client of the front for
  0.4-0.6 s (the key's copy and hash, the entry's copy).
- A hit answers with the outputs the request asked for. Triton answers a hit
  with every output stored, even ones the request did not ask for; here an
  entry that lacks an output the request asks for counts as a miss, and a
  request that names its outputs gets only those.
- Eviction is least-recently-used by bytes: an entry costs its key's input
  bytes plus its outputs' bytes plus a fixed overhead, and `size` bounds the
  sum. A response bigger than the whole cache is not stored.
- A model without a response cache pays one attribute test per request
  (`model.response_cache is None`); nothing here runs for it.
- Requests that use client shared memory are cached as in Triton: their
  inputs were copied out of the regions already, and Server.submit routes
  the response (a hit's too) into the output windows after this stores it.
- Decoupled models cannot enable the cache (kernel.config.pbtxt refuses them
  with Triton's message), so a miss always ends in exactly one final response.

Everything runs on the front process's event loop (no locks) but the hashing of a large request's
key and the copying of a large response into its entry, which run on kernel.core.beside's threads.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Optional

import numpy as np

from kernel.core.beside import run_beside
from kernel.core.cache_entry import stored_answer
from kernel.core.cache_key import local_key, local_key_bytes
from kernel.core.request import InferRequest, InferResponse, InferTensor

log = logging.getLogger("kernel.core.cache")

# What an entry costs beyond its tensor bytes (names, shapes, bookkeeping): a
# rough figure so that many tiny entries cannot exceed the configured size by
# much in real memory.
ENTRY_OVERHEAD_BYTES = 128

# A response with more output bytes than this is copied into its entry on a thread.
COPY_BESIDE_BYTES = 2 << 20

_now_ns = time.monotonic_ns


class CacheConfigError(ValueError):
    """`--cache-config` names an unknown cache or gives a bad setting."""


def create_cache(cache_config: dict[str, dict[str, str]]):
    """The server's response cache for `--cache-config` settings ({cache name: {setting: value}}).

    None when no cache is configured; Triton's `local` cache, or its `redis` cache
    (kernel.core.cache_redis, imported only then). Triton loads caches from shared
    libraries in --cache-directory; Kernel has these two built in.
    """
    if not cache_config:
        return None
    if len(cache_config) > 1:
        raise CacheConfigError(
            "only one cache can be configured; got " + ", ".join(repr(n) for n in sorted(cache_config)))
    name, settings = next(iter(cache_config.items()))
    if name == "redis":
        from kernel.core.cache_redis import RedisCache
        from kernel.core.cache_redis_settings import parse_settings

        return RedisCache(parse_settings(settings, CacheConfigError))
    if name != "local":
        raise CacheConfigError(
            f"unable to find cache '{name}': Kernel has the 'local' and 'redis' response caches "
            f"(it does not load libtritoncache_{name}.so)")
    unknown = sorted(set(settings) - {"size"})
    if unknown:
        raise CacheConfigError(f"unknown setting(s) for the 'local' cache: {', '.join(unknown)} (expected: size)")
    raw = settings.get("size")
    if raw is None:
        raise CacheConfigError("the 'local' cache needs a size: --cache-config local,size=<bytes>")
    try:
        size = int(raw)
    except ValueError:
        raise CacheConfigError(f"Failed to initialize LocalCache: size '{raw}' is not an integer") from None
    if size <= 0:
        raise CacheConfigError(f"Failed to initialize LocalCache: size must be a positive number of bytes, got {size}")
    return ResponseCache(size)


def _copies(views: list) -> list:
    """Read-only copies of `views`, made with numpy, which lets go of the GIL while it copies
    (bytes() of a view would hold it, and with it the loop)."""
    out = []
    for view in views:
        copy = np.empty(view.nbytes, np.uint8)
        np.copyto(copy, np.frombuffer(view, np.uint8))
        copy.flags.writeable = False
        out.append(memoryview(copy))
    return out


class _Entry:
    __slots__ = ("outputs", "parameters", "all_outputs", "nbytes")

    def __init__(self, outputs: list[InferTensor], parameters: dict, all_outputs: bool, nbytes: int):
        self.outputs = outputs
        self.parameters = parameters
        self.all_outputs = all_outputs  # stored from a request that asked for every output
        self.nbytes = nbytes

    def answer(self, requested) -> Optional[list[InferTensor]]:
        """The outputs for a request asking for `requested` (None: all), or None when this entry lacks some."""
        return stored_answer(self.outputs, self.all_outputs, requested)


class ResponseCache:
    """An LRU map from request keys to stored responses, bounded in bytes.

    One per server, shared by every model that enables the cache (as Triton's
    one cache is). The counters feed the global `nv_cache_*` gauges; the
    per-model hit/miss numbers live in each model's ModelStats.
    """

    def __init__(self, size: int):
        self.size = size
        self.used = 0
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.rejected = 0  # entries found unusable: none here (this process wrote them); the redis cache's can be
        self.lookup_ns = 0  # hits and misses
        self.insertion_ns = 0
        self.pending = 0  # responses waiting for their copy into the cache (the redis cache: its lookups)

    async def open(self) -> None:
        """Nothing to connect to (the redis cache connects here)."""

    async def close(self) -> None:
        pass

    # ---- numbers for /metrics --------------------------------------------------

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def utilization(self) -> float:
        return self.used / self.size if self.size else 0.0

    # ---- the request path -------------------------------------------------------

    @staticmethod
    def key(model, request: InferRequest) -> tuple:
        """The request's key (kernel.core.cache_key); large inputs are in it as digests, hashed with
        the GIL let go, so a large request's key is computed on a thread before it is admitted
        (kernel.core.admission)."""
        return local_key(model, request)

    def serve(self, model, request: InferRequest) -> bool:
        """Answer `request` from the cache (True), or arrange for its response to be stored (False).

        Called by Server.submit after validation, for models whose config
        enables the cache. On True the request's one response has been
        delivered already and the model must not be scheduled.
        """
        start = _now_ns()
        key = request.cache_key if request.cache_key is not None else local_key(model, request)
        entry = self._entries.get(key)
        outputs = entry.answer(request.outputs) if entry is not None else None
        if outputs is not None:
            self._entries.move_to_end(key)
            end = _now_ns()
            self.hits += 1
            self.lookup_ns += end - start
            model.stats.record_cache_hit(end - start, end - request.arrival_ns)
            request.on_response(InferResponse(model.name, model.version_str, request.id, outputs=outputs,
                                              parameters=dict(entry.parameters) if entry.parameters else None))
            return True
        lookup_ns = _now_ns() - start
        self.misses += 1
        self.lookup_ns += lookup_ns
        deliver = request.on_response
        stats = model.stats
        all_outputs = request.outputs is None

        def on_response(response: InferResponse) -> None:
            if response.final:
                if response.error is None:
                    t0 = _now_ns()
                    raws = [memoryview(t.raw) for t in response.outputs]
                    nbytes = ENTRY_OVERHEAD_BYTES + local_key_bytes(key) + sum(v.nbytes for v in raws)
                    if nbytes > self.size:
                        log.debug("response of %d bytes does not fit in the %d-byte response cache; not stored",
                                  nbytes, self.size)
                    elif nbytes > COPY_BESIDE_BYTES:
                        # Copied on a thread; the response waits for it (its buffers may be reused
                        # once it is sent) and counts as pending, so a graceful stop waits too.
                        self.pending += 1
                        copying = run_beside(_copies, raws)
                        copying.add_done_callback(
                            lambda done: self._copied(done, key, response, all_outputs, nbytes, t0, lookup_ns, stats, deliver))
                        return
                    else:
                        self._insert(key, response, [v.tobytes() for v in raws], all_outputs, nbytes)
                    inserted_ns = _now_ns() - t0
                    self.insertion_ns += inserted_ns
                    stats.record_cache_miss(lookup_ns + inserted_ns)
                else:
                    stats.record_cache_miss(lookup_ns)
            deliver(response)

        request.on_response = on_response
        return False

    def _copied(self, done, key, response: InferResponse, all_outputs: bool, nbytes: int, t0: int, lookup_ns: int,
                stats, deliver) -> None:
        """A large response's outputs were copied on a thread: store them, then send it on."""
        self.pending -= 1
        try:
            self._insert(key, response, done.result(), all_outputs, nbytes)
        except Exception:  # noqa: BLE001 - not stored; the client still gets its answer
            log.exception("storing a response in the response cache failed")
        inserted_ns = _now_ns() - t0
        self.insertion_ns += inserted_ns
        stats.record_cache_miss(lookup_ns + inserted_ns)
        deliver(response)

    def _insert(self, key: tuple, response: InferResponse, raws: list, all_outputs: bool, nbytes: int) -> None:
        # `raws`: copies of the output bytes (the response's buffers may belong to a worker's arena
        # or a transport's body and are reused once the response is sent).
        outputs = [InferTensor(t.name, t.datatype, t.shape, raw=raw) for t, raw in zip(response.outputs, raws)]
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= old.nbytes
        entries = self._entries
        while self.used + nbytes > self.size and entries:
            _, evicted = entries.popitem(last=False)
            self.used -= evicted.nbytes
            self.evictions += 1
        entries[key] = _Entry(outputs, dict(response.parameters) if response.parameters else {}, all_outputs, nbytes)
        self.used += nbytes

    def clear_model(self, model) -> None:
        """Drop a model version's entries: it was unloaded, nothing can hit them any more."""
        stats = model.stats
        for key in [k for k in self._entries if k[0] is stats]:
            self.used -= self._entries.pop(key).nbytes

