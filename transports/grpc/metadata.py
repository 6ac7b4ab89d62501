"""A gRPC call's client metadata, as the server libraries hand it to a handler.

Kernel's own HTTP/2 server sees the raw request headers; this turns them into
what a gRPC server exposes as metadata: the entries the client set plus
`user-agent`, without the HTTP/2 pseudo-headers and the headers the gRPC
protocol itself uses (`te`, `content-type`, `grpc-*`), and with `-bin`
entries base64-decoded into bytes.
"""

from __future__ import annotations

import binascii
from typing import Iterable

_PROTOCOL_HEADERS = frozenset({b"te", b"content-type"})


def client_metadata(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str | bytes]]:
    """(key, value) pairs of a call's metadata from its decoded request headers (raw bytes)."""
    out: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name[:1] == b":" or name[:5] == b"grpc-" or name in _PROTOCOL_HEADERS:
            continue
        key = name.decode("latin-1")
        if key.endswith("-bin"):
            out.append((key, _unbase64(value)))
        else:
            out.append((key, value.decode("latin-1")))
    return out


def _unbase64(value: bytes) -> bytes:
    # gRPC lets senders leave out the base64 padding.
    try:
        return binascii.a2b_base64(value + b"=" * (-len(value) % 4))
    except binascii.Error:
        return value
