"""The `redis` response cache's settings (`--cache-config redis,<setting>=<value>`): those of
Triton's redis cache, checked at start-up with its messages where it has them.

host and port (required), user, password, db, connect_timeout, socket_timeout, pool_size,
wait_timeout, and the TLS files cert, key, cacert, cacert_dir (any of them turns TLS on). Times
are milliseconds. Apart from kernel.core.cache_redis so that the cache itself stays one job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# Triton's 0 means "wait forever"; here every Redis command is bounded, by this instead.
DEFAULT_TIMEOUT_MS = 1000

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

    @property
    def socket_timeout_s(self) -> float:
        return (self.socket_timeout_ms or DEFAULT_TIMEOUT_MS) / 1000

    @property
    def connect_timeout_s(self) -> float:
        return (self.connect_timeout_ms or DEFAULT_TIMEOUT_MS) / 1000

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
