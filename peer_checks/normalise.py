"""What may legitimately differ between two correct servers, taken out before answers are compared.

- the server's own version string (GET /v2, gRPC ServerMetadata): Kernel reports its own
- times: statistics' `ns` totals and `last_inference` (milliseconds since the epoch)
- the temporary folder the check runs in (both serve the same one, but paths inside
  logs and messages may be spelled relative or absolute)
Counts, names, states, error texts and status codes are compared as they are.
"""

from __future__ import annotations

import re

_TIME_KEYS = {"ns", "last_inference"}
_VERSION_KEYS = {("name", "version")}  # server metadata: {"name": ..., "version": ..., "extensions": ...}


def normalise(value, base: str = ""):
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in _TIME_KEYS and isinstance(item, (int, float, str)):
                out[key] = "<time>"
            elif key == "version" and "extensions" in value:
                out[key] = "<server version>"
            else:
                out[key] = normalise(item, base)
        return out
    if isinstance(value, list):
        return [normalise(v, base) for v in value]
    if isinstance(value, str):
        if base:
            value = value.replace(base, "<base>")
        return re.sub(r"/tmp/folder\w+", "<override folder>", value)
    return value


def error_text(body) -> object:
    """The error text of an answer body (HTTP {"error": ...}, gRPC {"details": ...}), else the body."""
    if isinstance(body, dict):
        for key in ("error", "details"):
            if key in body:
                return body[key]
    return body
