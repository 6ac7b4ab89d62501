"""The `redis` response cache (`--cache-config redis,host=...,port=...`): Triton's shared cache, which
several replicas of a server use at once.

Settings are those of Triton's redis cache: host and port (required), user, password, db,
connect_timeout, socket_timeout, pool_size, wait_timeout, and the TLS files cert, key, cacert,
cacert_dir (any of them turns TLS on). Times are milliseconds.

Why it works this way:

- The key (kernel.core.cache_key) is the local cache's without what only one process knows: the
  model's name and version instead of its load, every input, the request parameters, correlation
  id and flags, serialized with explicit lengths and hashed with SHA-256, so
  every server computes the same key for the same request. Like Triton's redis cache it does not
  change when a model is reloaded: entries outlive a load (and the server), and Redis's own
  eviction policy bounds them.
- Nothing waits on Redis on the event loop. Server.submit hands a request of a caching model to
  `serve`, which queues its key and returns; lookups go out as MGETs (up to pool_size at a time,
  each carrying every key queued meanwhile), and each answer either answers the request (a hit) or
  schedules it (a miss). Inserts go out after the response was delivered, batched the same way as
  MSETs on one more connection, and are not awaited. Batching matters: redis-py spends on the
  order of 100 us of CPU per command, so one command per request would cost a hit as much as
  running a small model. Models without a response cache still pay one attribute test; the local
  cache is untouched.
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
import struct
import time
from dataclasses import dataclass
from typing import Optional

import msgspec

from kernel.core.cache_entry import stored_answer
from kernel.core.cache_key import redis_key
from kernel.core.errors import KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor

log = logging.getLogger("kernel.core.cache")

DEFAULT_TIMEOUT_MS = 1000
FAILURES_TO_OPEN = 3
FIRST_COOLDOWN_S = 1.0
MAX_COOLDOWN_S = 30.0
MAX_PENDING_INSERTS = 256  # inserts waiting for an MSET; beyond this a response is not stored
MAX_BATCH = 256  # keys in one MGET / MSET
MAX_BATCH_BYTES = 8 << 20  # bytes of values in one MSET
MAX_ENTRY_BYTES = 64 << 20  # responses above this are not stored (Redis values are capped at 512 MiB)

_now_ns = time.monotonic_ns
_monotonic = time.monotonic
_encode = msgspec.msgpack.encode
_decode = msgspec.msgpack.decode

SETTINGS = ("host", "port", "user", "password", "db", "connect_timeout", "socket_timeout", "pool_size",
            "wait_timeout", "cert", "key", "cacert", "cacert_dir")


@dataclass(frozen=True)
class RedisSettings:
    host: str
    port: int
    user: str = "default"
    password: Optional[str] = None
    db: int = 0
    connect_timeout_ms: int = 0
    socket_timeout_ms: int = 0
    pool_size: int = 1
    wait_timeout_ms: int = 100
    cert: str = ""
    key: str = ""
    cacert: str = ""
    cacert_dir: str = ""

    @property
    def tls(self) -> bool:
        return bool(self.cert or self.key or self.cacert or self.cacert_dir)

    def describe(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://{self.host}:{self.port}/{self.db}"


def parse_settings(settings: dict[str, str], error) -> RedisSettings:
    """`--cache-config redis,<setting>=<value>` settings; `error(message)` makes the exception to raise."""
    if "host" not in settings or "port" not in settings:
        raise error(
            "Failed to initialize RedisCache, didn't specify address. Must at a minimum specify 'host' and "
            "'port' in the configuration - e.g. tritonserver --cache-config redis,host=redis --cache-config "
            "redis,port=6379 --model-repository=/models ...")
    if "sni" in settings:
        raise error("the redis cache's 'sni' setting is not supported by Kernel: its client sends the host "
                    "name as the TLS server name (set host to the name the server's certificate carries)")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise error(f"unknown setting(s) for the 'redis' cache: {', '.join(unknown)} (expected: {', '.join(SETTINGS)})")

    def number(name: str, default: int, low: int = 0) -> int:
        raw = settings.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise error(f"Failed to initialize RedisCache: {name} '{raw}' is not an integer") from None
        if value < low:
            raise error(f"Failed to initialize RedisCache: {name} must be >= {low}, got {value}")
        return value

    port = number("port", 6379)
    if port > 65535:
        raise error(f"Failed to initialize RedisCache: port {port} is out of range")
    return RedisSettings(
        host=settings["host"], port=port, user=settings.get("user") or "default",
        password=settings.get("password"), db=number("db", 0),
        connect_timeout_ms=number("connect_timeout", 0), socket_timeout_ms=number("socket_timeout", 0),
        pool_size=number("pool_size", 1, low=1), wait_timeout_ms=number("wait_timeout", 100),
        cert=settings.get("cert", ""), key=settings.get("key", ""), cacert=settings.get("cacert", ""),
        cacert_dir=settings.get("cacert_dir", ""),
    )


class _Stored:
    """A decoded entry, answering as the local cache's entries do."""

    __slots__ = ("outputs", "parameters", "all_outputs")

    def __init__(self, doc):
        _version, self.all_outputs, params, tensors = doc
        self.parameters = msgspec.json.decode(params) if params else None
        self.outputs = [InferTensor(n, d, list(s), raw=r) for n, d, s, r in tensors]

    def answer(self, requested) -> Optional[list[InferTensor]]:
        return stored_answer(self.outputs, self.all_outputs, requested)


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
        self.pending = 0  # lookups not answered yet (Server.in_flight counts them)
        self._lookups: list = []  # (model, request, key, start) waiting for the next MGET
        self._getting = 0  # MGETs out (at most pool_size)
        self._inserts: dict = {}  # key -> (value, model stats, encoding ns) waiting for the next MSET
        self._setting = False  # an MSET is out (one at a time, on its own connection)
        self._failures = 0  # in a row
        self._open_until = 0.0  # circuit breaker: skip Redis until then
        self._cooldown = FIRST_COOLDOWN_S
        self._down = False  # said in the log that Redis is unavailable
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
            password=s.password, socket_timeout=(s.socket_timeout_ms or DEFAULT_TIMEOUT_MS) / 1000,
            socket_connect_timeout=(s.connect_timeout_ms or DEFAULT_TIMEOUT_MS) / 1000,
        )
        connection_class = Connection
        if s.tls:
            connection_class = SSLConnection
            kwargs.update(ssl_certfile=s.cert or None, ssl_keyfile=s.key or None, ssl_ca_certs=s.cacert or None,
                          ssl_ca_path=s.cacert_dir or None)
        # pool_size connections for lookups (MGETs), and one more for inserts (one MSET at a time).
        pool = BlockingConnectionPool(max_connections=s.pool_size + 1, timeout=s.wait_timeout_ms / 1000,
                                      connection_class=connection_class, **kwargs)
        self.client = aioredis.Redis(connection_pool=pool)
        try:
            await self.client.ping()
        except Exception as exc:  # noqa: BLE001 - whatever the client raises, the message names it
            await self.close()
            raise RuntimeError(f"Failed to initialize RedisCache: {s.describe()}: {_why(exc)}") from None
        log.info("response cache: redis at %s", s.describe())

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=(self.settings.socket_timeout_ms or DEFAULT_TIMEOUT_MS) / 1000)
        client, self.client = self.client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception:  # noqa: BLE001
                pass

    # ---- the request path -------------------------------------------------------------

    def serve(self, model, request: InferRequest) -> bool:
        """Take the request over (True): its lookup joins the next MGET, and the answer either
        answers it or schedules it. While the circuit breaker is open, a miss decided on the spot
        (False: the caller schedules it)."""
        start = _now_ns()
        if self._breaker_open() or self.client is None:
            self._miss(model, request, None, start)
            return False
        self.pending += 1
        self._lookups.append((model, request, redis_key(model, request), start))
        if self._getting < self.settings.pool_size:
            self._start_get()
        return True

    def _breaker_open(self) -> bool:
        return bool(self._open_until) and _monotonic() < self._open_until

    def _start_get(self) -> None:
        # Every lookup queued while the previous MGETs were out goes in one command: under load the
        # client's per-command cost is paid once for many requests.
        batch, self._lookups = self._lookups[:MAX_BATCH], self._lookups[MAX_BATCH:]
        self._getting += 1
        self._track(self._get_batch(batch))

    async def _get_batch(self, batch: list) -> None:
        values = None
        try:
            values = await self.client.mget([b[2] for b in batch])
            self._succeeded()
        except Exception as exc:  # noqa: BLE001 - Redis's trouble is a miss, never the request's
            self._failed(exc)
        finally:
            self._getting -= 1
            self.pending -= len(batch)
        for i, (model, request, key, start) in enumerate(batch):
            self._answer(model, request, key, start, values[i] if values is not None else None)
        if self._lookups and self._getting < self.settings.pool_size:
            if self._breaker_open():  # Redis went away meanwhile: what waits is computed now
                waiting, self._lookups = self._lookups, []
                self.pending -= len(waiting)
                for model, request, key, start in waiting:
                    self._answer(model, request, None, start, None)
            else:
                self._start_get()

    def _answer(self, model, request: InferRequest, key: Optional[bytes], start: int, data) -> None:
        """A lookup's outcome: answer the request from the entry, or let the model compute it."""
        outputs = None
        if data is not None:
            try:
                stored = _Stored(_decode(data))
                outputs = stored.answer(request.outputs)
            except Exception:  # noqa: BLE001 - an entry this version cannot read is a miss
                outputs = None
        if outputs is not None:
            end = _now_ns()
            self.hits += 1
            self.lookup_ns += end - start
            model.stats.record_cache_hit(end - start, end - request.arrival_ns)
            request.on_response(InferResponse(model.name, model.version_str, request.id, outputs=outputs,
                                              parameters=dict(stored.parameters) if stored.parameters else None))
            return
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
                    self._store(key, response, all_outputs, stats)
            deliver(response)

        request.on_response = on_response

    def _store(self, key: bytes, response: InferResponse, all_outputs: bool, stats) -> None:
        if len(self._inserts) >= MAX_PENDING_INSERTS or self._breaker_open():
            return
        t0 = _now_ns()
        params = msgspec.json.encode(response.parameters) if response.parameters else b""
        # Encoding copies the output bytes: the response's buffers are reused once it is sent.
        value = _encode([1, all_outputs, params, [(t.name, t.datatype, list(t.shape), t.raw) for t in response.outputs]])
        if len(value) > MAX_ENTRY_BYTES:
            return
        self._inserts[key] = (value, stats, _now_ns() - t0)
        if not self._setting:
            self._start_set()

    def _start_set(self) -> None:
        batch, size = {}, 0
        while self._inserts and (not batch or (len(batch) < MAX_BATCH and size < MAX_BATCH_BYTES)):
            key = next(iter(self._inserts))
            entry = batch[key] = self._inserts.pop(key)
            size += len(entry[0])
        self._setting = True
        self._track(self._set_batch(batch))

    async def _set_batch(self, batch: dict) -> None:
        t0 = _now_ns()
        try:
            await self.client.mset({key: entry[0] for key, entry in batch.items()})
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
        if self._inserts:
            if self._breaker_open():
                self._inserts.clear()
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


def _why(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


def _pool_busy(exc: Exception) -> bool:
    return type(exc).__name__ == "ConnectionError" and "No connection available" in str(exc)
