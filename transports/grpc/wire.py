"""gRPC's own bytes on HTTP/2: the response header block, trailers with grpc-status and a
percent-encoded grpc-message, and grpc-timeout values. Used by the native server."""

from __future__ import annotations

from typing import Optional

from kernel.transports.grpc.http2.frames import hpack_int, literal

# ':status: 200' is entry 8 of the static table; content-type is entry 31.
RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + hpack_int(len(b"application/grpc"), 7) + b"application/grpc"
TRAILERS_OK = literal(b"grpc-status", b"0")
# The response headers of a call whose answers are compressed (compression.py), by algorithm.
COMPRESSED_RESPONSE_HEADERS = {
    name: RESPONSE_HEADERS + literal(b"grpc-encoding", name) for name in (b"gzip", b"deflate")
}


def status_block(code: int, message: str) -> bytes:
    block = literal(b"grpc-status", str(code).encode())
    if message:
        block += literal(b"grpc-message", percent_encode(message))
    return block


def percent_encode(message: str) -> bytes:
    raw = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


# gRPC C++ servers' answer to a request message that does not parse.
PARSE_ERROR = "Unable to parse request"

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def parse_timeout(value: bytes) -> Optional[float]:
    try:
        return int(value[:-1]) * _TIMEOUT_UNITS[value[-1:]]
    except (KeyError, ValueError):
        return None
