"""HTTP/2 wire constants and frame encoding (RFC 9113), and the HPACK encoding of response headers.

Kept apart from the connection so the constants can be shared by the gRPC layer
and by tests without pulling in the connection's state machine.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

# error codes (RFC 9113 section 7)
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
SETTINGS_TIMEOUT = 0x4
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1

FRAME_HEADER = struct.Struct(">HBBBL")  # 24-bit length split 16+8, type, flags, stream id
U32 = struct.Struct(">L")
SETTING = struct.Struct(">HL")
GOAWAY_PAYLOAD = struct.Struct(">LL")


class ProtocolError(Exception):
    """A connection error: answered with GOAWAY carrying `code`, then the connection closes."""

    def __init__(self, code: int, message: str, debug: bytes = b""):
        super().__init__(message)
        self.code = code
        self.debug = debug


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEADER.pack(n >> 8, n & 0xFF, kind, flags, stream_id) + payload


def frame_head(kind: int, flags: int, stream_id: int, n: int) -> bytes:
    """The 9-byte header of a frame whose n-byte payload is written separately (no copy of it)."""
    return FRAME_HEADER.pack(n >> 8, n & 0xFF, kind, flags, stream_id)


# ---------------------------------------------------------------- HPACK output (no dynamic table)


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A 'literal header field without indexing - new name', no Huffman coding.

    Responses never touch the HPACK dynamic table, so their header blocks can be
    precomputed constants.
    """
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value
