"""Restricted APIs: groups of endpoints that answer only to requests carrying a header.

tritonserver's `--http-restricted-api=<apis>:<key>=<value>` and
`--grpc-restricted-protocol=<apis>:<key>=<value>` (repeatable; an API may sit in
one group only). Over HTTP the request must carry header `<key>: <value>`;
over gRPC the metadata key is `triton-grpc-protocol-<key>`. Transports classify
each request into a `Category` (`http_category`, `grpc_category` below) and look up its
`Restriction`; when nothing is restricted they hold no Restrictions at all, so
unrestricted serving pays nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, Optional, Union

# The gRPC metadata key is this prefix + the configured key.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


class Category(str, enum.Enum):
    """The API groups tritonserver can restrict, by their command-line names."""

    HEALTH = "health"
    METADATA = "metadata"
    INFERENCE = "inference"
    SHARED_MEMORY = "shared-memory"
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"
    STATISTICS = "statistics"
    TRACE = "trace"
    LOGGING = "logging"


@dataclass(frozen=True)
class Restriction:
    """The header (lower-case; header names are case-insensitive) and the exact value it must have."""

    header: str
    value: str


class RestrictionError(ValueError):
    """A restriction setting that cannot be used (unknown API, API in two groups, bad format)."""


@dataclass
class Restrictions:
    """Which categories are restricted, and by which header/value."""

    rules: dict[Category, Restriction] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def restrict(self, apis: Iterable[Union[str, Category]], header: str, value: str,
                 kind: str = "api") -> "Restrictions":
        """Add one group: every API in `apis` needs `header: value`. Returns self."""
        for api in apis:
            try:
                category = Category(api)
            except ValueError:
                raise RestrictionError(f"unknown restricted {kind} '{api}'") from None
            if category in self.rules:
                raise RestrictionError(
                    f"restricted {kind} '{category.value}' can not be specified in multiple config groups"
                )
            self.rules[category] = Restriction(header.lower(), value)
        return self

    def get(self, category: Optional[Category]) -> Optional[Restriction]:
        return self.rules.get(category) if category is not None else None

    @classmethod
    def parse_http(cls, settings: Iterable[str]) -> "Restrictions":
        """From `--http-restricted-api` values; raises RestrictionError with tritonserver's wording."""
        return cls._parse(settings, "", "api", "http-restricted-api")

    @classmethod
    def parse_grpc(cls, settings: Iterable[str]) -> "Restrictions":
        """From `--grpc-restricted-protocol` values (keys get the `triton-grpc-protocol-` prefix)."""
        return cls._parse(settings, GRPC_HEADER_PREFIX, "protocol", "grpc-restricted-protocol")

    @classmethod
    def _parse(cls, settings: Iterable[str], header_prefix: str, kind: str, flag: str) -> "Restrictions":
        out = cls()
        for setting in settings:
            apis, key, value = _split(setting, flag)
            out.restrict([a.strip() for a in apis.split(",") if a.strip()], header_prefix + key, value, kind)
        return out


def _split(setting: str, flag: str) -> tuple[str, str, str]:
    """`<apis>:<key>=<value>`, all three non-empty."""
    apis, sep, rest = setting.partition(":")
    key, sep2, value = rest.partition("=")
    if not sep or not sep2 or not apis or not key or not value:
        raise RestrictionError(f"--{flag} option format is '<config name>:<setting>=<value>'. Got {setting}")
    return apis, key, value


def http_message(header: str) -> str:
    """The 403 body's message for a restricted HTTP API."""
    return f"This API is restricted, expecting header '{header}'"


def grpc_message(header: str) -> str:
    """The status message (code UNAVAILABLE, as tritonserver answers) for a restricted RPC."""
    return f"This protocol is restricted, expecting header '{header}'"


# ---- which category a request belongs to ------------------------------------
# Classified by URL path (HTTP) or RPC name (gRPC) alone, so routes added to the transports later
# fall into the right group without touching their handlers.

# /v2/models/<name>[/versions/<v>]/<action>
_MODEL_ACTIONS = {
    "": Category.METADATA,
    "ready": Category.HEALTH,
    "config": Category.MODEL_CONFIG,
    "stats": Category.STATISTICS,
    "infer": Category.INFERENCE,
    "generate": Category.INFERENCE,
    "generate_stream": Category.INFERENCE,
    "trace": Category.TRACE,
}


def http_category(path: str) -> Optional[Category]:
    """The category of a KServe v2 HTTP path; None for paths outside every group (404s)."""
    if not path.startswith("/v2"):
        return None
    rest = path[3:]
    if rest in ("", "/"):
        return Category.METADATA
    if rest.startswith("/models/"):
        if rest == "/models/stats":
            return Category.STATISTICS
        parts = rest[8:].split("/")
        tail = parts[1:]
        if len(tail) >= 2 and tail[0] == "versions":
            tail = tail[2:]
        return _MODEL_ACTIONS.get(tail[0] if tail else "")
    if rest.startswith("/health/"):
        return Category.HEALTH
    if rest.startswith("/trace/"):
        return Category.TRACE
    if rest == "/logging":
        return Category.LOGGING
    if rest.startswith(("/systemsharedmemory", "/cudasharedmemory")):
        return Category.SHARED_MEMORY
    if rest.startswith("/repository"):
        return Category.MODEL_REPOSITORY
    return None


_RPCS = {
    "ServerLive": Category.HEALTH,
    "ServerReady": Category.HEALTH,
    "ModelReady": Category.HEALTH,
    "Check": Category.HEALTH,  # grpc.health.v1.Health
    "ServerMetadata": Category.METADATA,
    "ModelMetadata": Category.METADATA,
    "ModelConfig": Category.MODEL_CONFIG,
    "ModelStatistics": Category.STATISTICS,
    "TraceSetting": Category.TRACE,
    "LogSettings": Category.LOGGING,
    "ModelInfer": Category.INFERENCE,
    "ModelStreamInfer": Category.INFERENCE,
}


def grpc_category(rpc: str) -> Optional[Category]:
    """The category of a gRPC method, by its name ("ModelInfer") or full path ("/pkg.Service/ModelInfer")."""
    name = rpc.rsplit("/", 1)[-1]
    category = _RPCS.get(name)
    if category is not None:
        return category
    if "SharedMemory" in name:
        return Category.SHARED_MEMORY
    if name.startswith("Repository"):
        return Category.MODEL_REPOSITORY
    return None
