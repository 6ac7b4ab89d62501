"""Server url forms the clients accept: host, host:port, http://host:port, grpc://host:port."""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit

from kernel.client.exceptions import PyTritonClientInvalidUrlError

DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
_DEFAULT_PORTS = {"http": DEFAULT_HTTP_PORT, "grpc": DEFAULT_GRPC_PORT}


@dataclasses.dataclass(frozen=True)
class TritonUrl:
    scheme: str  # "http" or "grpc"
    hostname: str
    port: int

    @classmethod
    def from_url(cls, url: str) -> "TritonUrl":
        if not isinstance(url, str) or not url.strip():
            raise PyTritonClientInvalidUrlError(
                f"Invalid url {url!r}: expected a string such as 'grpc://localhost:8001'"
            )
        text = url.strip()
        if "://" not in text:
            text = "http://" + text  # no scheme means HTTP, as in PyTriton
        try:
            parts = urlsplit(text)
            port = parts.port  # raises ValueError for a non-numeric or out-of-range port
        except ValueError as exc:
            raise PyTritonClientInvalidUrlError(f"Invalid url {url!r}: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise PyTritonClientInvalidUrlError(
                f"Invalid url {url!r}: scheme {scheme!r} is not supported, use 'http' or 'grpc'"
            )
        if not parts.hostname:
            raise PyTritonClientInvalidUrlError(f"Invalid url {url!r}: no host name")
        return cls(scheme, parts.hostname, port or _DEFAULT_PORTS[scheme])

    @property
    def without_scheme(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{host}:{self.port}"

    @property
    def with_scheme(self) -> str:
        return f"{self.scheme}://{self.without_scheme}"
