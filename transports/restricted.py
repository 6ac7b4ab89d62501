"""Which restricted-API category (kernel.restrictions.Category) a request belongs to.

Classified by URL path (HTTP) or RPC name (gRPC) alone, so routes added to the
transports later fall into the right group without touching their handlers.
"""

from __future__ import annotations

from typing import Optional

from kernel.restrictions import Category

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
