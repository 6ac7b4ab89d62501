"""The `redis` response cache (`--cache-config redis,host=...,port=...`): Triton's shared cache, which
several replicas of a server use at once. Its settings are kernel.core.cache_redis_settings.

Why it works this way:

- The key (kernel.core.cache_key) is the local cache's without what only one process knows: the
  model's name and version instead of its load, every input, the request parameters, correlation
  id and flags, serialized with explicit lengths and hashed with SHA-256, so every server computes
  the same key for the same request. Like Triton's redis cache it does not change when a model is
  reloaded: entries outlive a load (and the server), and Redis's own eviction policy bounds them.
- Nothing waits on Redis on the event loop. Server.submit hands a request of a caching model to
  `serve`, which queues its key and returns; lookups go out in batches (up to pool_size at a time,
  each carrying every key queued meanwhile), and each answer either answers the request (a hit) or
  schedules it (a miss). Requests asking for a key whose lookup is already out wait for that one:
  40 requests for the same entry read it once. Inserts go out after the response was delivered,
  batched the same way as MSETs on one more connection, and are not awaited. Batching matters:
  redis-py spends on the order of 100 us of CPU per command, so one command per request would cost
  a hit as much as running a small model. Models without a response cache still pay one attribute
  test; the local cache is untouched.
- Entry sizes never reach the loop unbounded (kernel.core.cache_redis_reads): a lookup batch
  brings back small values whole, within a byte budget, and only the lengths of large ones;
  a large entry is read in pieces, at most LARGE_READS at once, each on its own connection, and
  decoded and checked off the loop. A lookup that waited for a large read longer than the socket
  timeout is computed instead. Responses over MAX_ENTRY_BYTES (64 MiB) are not stored and entries
  over it are not read; encoded entries waiting to be written are bounded by MAX_INSERT_BYTES
  (beyond it a response is not stored). What the cache holds itself is thus at most pool_size x
  BATCH_BYTES for lookups, LARGE_READS x MAX_ENTRY_BYTES for large reads, and MAX_INSERT_BYTES
  for inserts.
- Redis is shared, so an entry is checked before it answers anyone (kernel.core.cache_redis_entry:
  its format and digest, each tensor's bytes against its shape, BYTES elements well formed, the
  outputs and datatypes against the model's config). A rejected entry is a miss: the request is
  computed and its response replaces the entry; rejections are counted (`rejected`, the metric
  kernel_cache_num_rejected_entries) and the first one is logged with its reason.
- Redis can fail or slow down without failing or stalling inference: every command is bounded
  (socket_timeout and connect_timeout; Triton's 0, "wait forever", becomes DEFAULT_TIMEOUT_MS
  here), a failed lookup is a miss and the request is computed, and after FAILURES_TO_OPEN
  failures in a row a circuit breaker skips Redis altogether (each request a miss, decided
  without a task) for a cool-down that doubles up to MAX_COOLDOWN_S while Redis stays away. The
  log says so once when Redis goes away and once when it is back, never per request.
- Statistics are the local cache's: per model cache hits and misses with their durations, and
  the server's nv_cache_* counts (entries: those this server stored; utilization: 0, Redis keeps
  its own memory accounting).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Optional

from kernel.core.cache_key import redis_key
from kernel.core.cache_redis_entry import BadEntry, Stored, decode, encode, fits, payload_size, seal
from kernel.core.cache_redis_reads import INLINE_BYTES, Reader
from kernel.core.cache_redis_settings import RedisSettings
from kernel.core.errors import KernelError
from kernel.core.request import InferRequest, InferResponse

log = logging.getLogger("kernel.core.cache")

FAILURES_TO_OPEN = 3
FIRST_COOLDOWN_S = 1.0
MAX_COOLDOWN_S = 30.0
MAX_ENTRY_BYTES = 64 << 20  # responses above this are not stored, entries above it not read (README)
LARGE_READS = 2  # large entries read at once, each on a connection of its own
DECODE_ON_LOOP_BYTES = 64 << 10  # a lookup batch bringing back more than this is decoded off the loop
SEAL_ON_LOOP_BYTES = 1 << 20  # an entry larger than this gets its digest off the loop
MAX_INSERT_BYTES = 2 * MAX_ENTRY_BYTES  # encoded entries waiting for an MSET or in one
MAX_PENDING_INSERTS = 256  # inserts waiting for an MSET; beyond this a response is not stored
MAX_BATCH = 256  # keys in one MSET
MAX_BATCH_BYTES = 8 << 20  # bytes of values in one MSET (a larger entry goes alone)

_now_ns = time.monotonic_ns
_monotonic = time.monotonic


class RedisCache:
    """The response cache in a Redis server several Kernel servers share."""

    def __init__(self, settings: RedisSettings):
        self.settings = settings
        self.client = None
        self.hits = 0
        self.misses = 0
        self.evictions = 0  # Redis evicts on its own; this server sees none
        self.lookup_ns = 0
        self.insertion_ns = 0
        self.stored = 0  # entries this server wrote
        self.rejected = 0  # entries read and not used (kernel.core.cache_redis_entry)
        self.pending = 0  # requests whose lookup is not answered yet (Server.in_flight counts them)
        self._reader: Optional[Reader] = None
        self._waiting: dict = {}  # key -> [(model, request, start)]: requests waiting for its lookup
        self._lookups: deque = deque()  # keys waiting for the next lookup batch
        self._getting = 0  # lookup batches out (at most pool_size)
        self._large: deque = deque()  # (key, size) waiting for a large read
        self._reading = 0  # large reads out (at most LARGE_READS)
        self._wait_ns = int(settings.socket_timeout_s * 1e9)
        self._inserts: dict = {}  # key -> (value, model stats, encoding ns) waiting for the next MSET
        self._insert_bytes = 0  # their values' bytes, and those of the MSET out
        self._setting = False  # an MSET is out (one at a time, on its own connection)
        self._failures = 0  # in a row
        self._open_until = 0.0  # circuit breaker: skip Redis until then
        self._cooldown = FIRST_COOLDOWN_S
        self._down = False  # said in the log that Redis is unavailable
        self._told_rejected = False  # said in the log that an entry was rejected
        self._tasks: set = set()

    # ---- numbers for /metrics -------------------------------------------------------

    @property
    def entries(self) -> int:
        return self.stored

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def utilization(self) -> float:
        return 0.0

    # ---- lifecycle ------------------------------------------------------------------

    async def open(self) -> None:
        """Connect and ping, as Triton's redis cache does at start-up; raises RuntimeError when Redis
        cannot be reached (the server does not start)."""
        try:
            import redis.asyncio as aioredis
            from redis.asyncio.connection import BlockingConnectionPool, Connection, SSLConnection
        except ImportError as exc:
            raise RuntimeError("--cache-config redis needs redis-py: pip install 'kernel-inference-server[redis]' "
                               f"({exc})") from None
        s = self.settings
        kwargs = dict(
            host=s.host, port=s.port, db=s.db, username=s.user if s.password is not None else None,
            password=s.password, socket_timeout=s.socket_timeout_s, socket_connect_timeout=s.connect_timeout_s,
        )
        connection_class = Connection
        if s.tls:
            connection_class = SSLConnection
            kwargs.update(ssl_certfile=s.cert or None, ssl_keyfile=s.key or None, ssl_ca_certs=s.cacert or None,
                          ssl_ca_path=s.cacert_dir or None)
        # pool_size connections for lookups, LARGE_READS for large entries, one for inserts (one MSET at a time).
        pool = BlockingConnectionPool(max_connections=s.pool_size + LARGE_READS + 1, timeout=s.wait_timeout_ms / 1000,
                                      connection_class=connection_class, **kwargs)
        self.client = aioredis.Redis(connection_pool=pool)
        try:
            await self.client.ping()
            self._reader = Reader(self.client)
            await self._reader.choose()
        except Exception as exc:  # noqa: BLE001 - whatever the client raises, the message names it
            await self.close()
            raise RuntimeError(f"Failed to initialize RedisCache: {s.describe()}: {_why(exc)}") from None
        log.info("response cache: redis at %s", s.describe())

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.settings.socket_timeout_s)
        client, self.client = self.client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception:  # noqa: BLE001
                pass

    # ---- the request path -------------------------------------------------------------

    @staticmethod
    def key(model, request: InferRequest) -> bytes:
        """The request's key (kernel.core.cache_key); hashlib lets go of the GIL, so a large one is
        hashed on a thread before the request is admitted (kernel.core.admission)."""
        return redis_key(model, request)

    def serve(self, model, request: InferRequest) -> bool:
        """Take the request over (True): its lookup joins the next batch (or the one out for the same
        key), and the answer either answers it or schedules it. While the circuit breaker is open, a
        miss decided on the spot (False: the caller schedules it)."""
        start = _now_ns()
        if self._breaker_open() or self.client is None:
            self._miss(model, request, None, start)
            return False
        key = request.cache_key if request.cache_key is not None else redis_key(model, request)
        self.pending += 1
        waiting = self._waiting.get(key)
        if waiting is not None:
            waiting.append((model, request, start))
            return True
        self._waiting[key] = [(model, request, start)]
        self._lookups.append(key)
        if self._getting < self.settings.pool_size:
            self._start_get()
        return True

    def _breaker_open(self) -> bool:
        return bool(self._open_until) and _monotonic() < self._open_until

    def _start_get(self) -> None:
        # Every key queued while the previous batches were out goes in one command: under load the
        # client's per-command cost is paid once for many requests.
        lookups = self._lookups
        batch = [lookups.popleft() for _ in range(min(self._reader.batch_keys, len(lookups)))]
        self._getting += 1
        self._track(self._get_batch(batch))

    async def _get_batch(self, keys: list) -> None:
        replies = None
        try:
            replies = await self._reader.lookup(keys)
            self._succeeded()
        except Exception as exc:  # noqa: BLE001 - Redis's trouble is a miss, never the request's
            self._failed(exc)
        finally:
            self._getting -= 1
        if replies is None or len(replies) != len(keys):
            for key in keys:
                self._resolve(key, None)
        else:
            found = self._sort(keys, replies)
            self._next()
            if found:
                if sum(len(v) for _, v in found) > DECODE_ON_LOOP_BYTES:
                    decoded = await asyncio.to_thread(_decode_all, found)
                else:
                    decoded = _decode_all(found)
                for key, stored in decoded:
                    if isinstance(stored, BadEntry):
                        self._reject(key, str(stored))
                    else:
                        self._resolve(key, stored)
        self._next()

    def _sort(self, keys: list, replies: list) -> list:
        """What each key's reply asks for next; returns the (key, value) pairs to decode."""
        found, again = [], []
        for key, reply in zip(keys, replies):
            if isinstance(reply, bytes):
                found.append((key, reply))
            elif not isinstance(reply, int):
                self._reject(key, "redis answered its lookup with something other than a value or a length")
            elif reply == 0:
                self._resolve(key, None)  # no such entry
            elif reply < 0:
                self._reject(key, "its key holds something other than a string")
            elif reply > MAX_ENTRY_BYTES:
                self._reject(key, f"it is {reply} bytes, over the {MAX_ENTRY_BYTES}-byte limit on entries")
            elif reply > INLINE_BYTES:
                self._large.append((key, reply))
            else:
                again.append(key)  # small, but over this batch's byte budget: the next batch
        self._lookups.extendleft(reversed(again))
        return found

    def _next(self) -> None:
        """Start what waits, as far as the connections allow; with the breaker open, compute it all now."""
        if self._breaker_open():
            while self._lookups:
                self._resolve(self._lookups.popleft(), None)
            while self._large:
                self._resolve(self._large.popleft()[0], None)
            return
        while self._lookups and self._getting < self.settings.pool_size:
            self._start_get()
        while self._large and self._reading < LARGE_READS:
            key, size = self._large.popleft()
            waiting = self._waiting.get(key)
            if not waiting:
                continue
            if _now_ns() - waiting[0][2] > self._wait_ns:
                self._resolve(key, None)  # waited behind other large reads for longer than Redis may take
                continue
            self._reading += 1
            self._track(self._read_large(key, size))

    async def _read_large(self, key: bytes, size: int) -> None:
        value = stored = None
        try:
            value = await self._reader.read_large(key, size)
            self._succeeded()
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
        try:
            if value is not None:
                stored = (await asyncio.to_thread(_decode_all, [(key, value)]))[0][1]
        finally:
            self._reading -= 1
        if isinstance(stored, BadEntry):
            self._reject(key, str(stored))
        else:
            self._resolve(key, stored)  # None: gone or shortened meanwhile, or Redis failed: a miss
        self._next()

    def _reject(self, key: bytes, why: str) -> None:
        self.rejected += 1
        if not self._told_rejected:
            self._told_rejected = True
            waiting = self._waiting.get(key)
            model = f" for model '{waiting[0][0].name}'" if waiting else ""
            log.warning("response cache: an entry in redis at %s%s was not used: %s; its request is computed and "
                        "its response replaces the entry (further rejected entries are counted in "
                        "kernel_cache_num_rejected_entries, not logged)", self.settings.describe(), model, why)
        self._resolve(key, None)

    def _resolve(self, key: bytes, stored: Optional[Stored]) -> None:
        """A lookup's outcome for every request waiting on it: answered from the entry, or computed."""
        waiting = self._waiting.get(key)
        if not waiting:
            return
        if stored is not None:
            why = fits(waiting[0][0], stored.outputs)
            if why is not None:
                self._reject(key, why)  # resolves it as a miss
                return
        del self._waiting[key]
        self.pending -= len(waiting)
        for model, request, start in waiting:
            outputs = stored.answer(request.outputs) if stored is not None else None
            if outputs is not None:
                end = _now_ns()
                self.hits += 1
                self.lookup_ns += end - start
                model.stats.record_cache_hit(end - start, end - request.arrival_ns)
                request.on_response(InferResponse(model.name, model.version_str, request.id, outputs=outputs,
                                                  parameters=dict(stored.parameters) if stored.parameters else None))
                continue
            self._miss(model, request, key, start)
            try:
                model.scheduler.enqueue(request)
            except KernelError as exc:  # refused now rather than in Server.submit: the client gets it as the answer
                request.on_response(InferResponse(model.name, model.version_str, request.id, error=exc))

    def _miss(self, model, request: InferRequest, key: Optional[bytes], start: int) -> None:
        """Count a miss and store the response on its way back (unless Redis is away)."""
        lookup_ns = _now_ns() - start
        self.misses += 1
        self.lookup_ns += lookup_ns
        deliver = request.on_response
        stats = model.stats
        all_outputs = request.outputs is None

        def on_response(response: InferResponse) -> None:
            if response.final:
                stats.record_cache_miss(lookup_ns)
                if key is not None and response.error is None:
                    self._store(key, response, all_outputs, model)
            deliver(response)

        request.on_response = on_response

    def _store(self, key: bytes, response: InferResponse, all_outputs: bool, model) -> None:
        if len(self._inserts) >= MAX_PENDING_INSERTS or self._breaker_open():
            return
        size = payload_size(response.outputs)
        if size > MAX_ENTRY_BYTES or self._insert_bytes + size > MAX_INSERT_BYTES:
            return
        if fits(model, response.outputs) is not None:
            return  # its config does not describe this response: a reader would reject it
        t0 = _now_ns()
        value = encode(response.outputs, response.parameters, all_outputs)
        if len(value) > MAX_ENTRY_BYTES:
            return
        if len(value) <= SEAL_ON_LOOP_BYTES:
            seal(value)  # larger ones are sealed off the loop, before their MSET
        old = self._inserts.pop(key, None)
        if old is not None:
            self._insert_bytes -= len(old[0])
        self._inserts[key] = (value, model.stats, _now_ns() - t0)
        self._insert_bytes += len(value)
        if not self._setting:
            self._start_set()

    def _start_set(self) -> None:
        batch, size = {}, 0
        while self._inserts and (not batch or (len(batch) < MAX_BATCH and size < MAX_BATCH_BYTES)):
            key = next(iter(self._inserts))
            entry = batch[key] = self._inserts.pop(key)
            size += len(entry[0])
        self._setting = True
        self._track(self._set_batch(batch, size))

    async def _set_batch(self, batch: dict, size: int) -> None:
        t0 = _now_ns()
        try:
            large = [entry[0] for entry in batch.values() if len(entry[0]) > SEAL_ON_LOOP_BYTES]
            if large:
                await asyncio.to_thread(_seal_all, large)
            await self.client.mset({key: memoryview(entry[0]) for key, entry in batch.items()})
            self._succeeded()
            self.stored += len(batch)
            share = (_now_ns() - t0) // len(batch)
            for _value, stats, encode_ns in batch.values():
                self.insertion_ns += encode_ns + share
                stats.add_cache_insert_ns(encode_ns + share)
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
        finally:
            self._setting = False
            self._insert_bytes -= size
        if self._inserts:
            if self._breaker_open():
                self._inserts.clear()
                self._insert_bytes = 0
            else:
                self._start_set()

    def _track(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- circuit breaker --------------------------------------------------------------

    def _succeeded(self) -> None:
        if self._failures or self._open_until:
            self._failures = 0
            self._open_until = 0.0
            self._cooldown = FIRST_COOLDOWN_S
            if self._down:
                self._down = False
                log.warning("response cache: redis at %s answers again; caching resumes", self.settings.describe())

    def _failed(self, exc: Exception) -> None:
        if _pool_busy(exc):
            return  # every connection busy for wait_timeout: this lookup is a miss, Redis is not at fault
        self._failures += 1
        if self._failures < FAILURES_TO_OPEN and not self._open_until:
            return
        self._open_until = _monotonic() + self._cooldown
        self._cooldown = min(self._cooldown * 2, MAX_COOLDOWN_S)
        if not self._down:
            self._down = True
            log.warning("response cache: redis at %s is unavailable (%s); requests are computed and not cached "
                        "until it answers again", self.settings.describe(), _why(exc))

    def clear_model(self, model) -> None:
        """Entries are shared with other servers and outlive this load: nothing to drop here."""


def _decode_all(found: list) -> list:
    """[(key, Stored or the BadEntry that rejects it)] for [(key, value)]."""
    out = []
    for key, value in found:
        try:
            out.append((key, decode(value)))
        except BadEntry as exc:
            out.append((key, exc))
        except Exception as exc:  # noqa: BLE001 - whatever else a hostile value provokes rejects it too
            out.append((key, BadEntry(f"it does not decode: {type(exc).__name__}: {exc}")))
    return out


def _seal_all(values: list) -> None:
    for value in values:
        seal(value)


def _why(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


def _pool_busy(exc: Exception) -> bool:
    return type(exc).__name__ == "ConnectionError" and "No connection available" in str(exc)
