"""Request header blocks: HEADERS + CONTINUATION reassembly and HPACK decoding, within limits.

One decoder per connection (HPACK state is per connection), a small cache of
decoded blocks (most requests on a connection repeat the same block, so a cache
hit skips decoding), and the bounds a client could otherwise push without end:
block size, frames per block, header list size and what the cache keeps.
"""

from __future__ import annotations

from typing import Optional

import hpack

from kernel.transports.grpc.http2.frames import COMPRESSION_ERROR, ENHANCE_YOUR_CALM, PROTOCOL_ERROR
from kernel.transports.grpc.http2.limits import Http2Limits

# The cache keeps only small blocks, and only so many: a block of indexed fields is a few
# dozen bytes, and a connection repeats a handful of them.
CACHE_ENTRIES = 64
CACHE_BLOCK_BYTES = 512


class HeaderError(Exception):
    """A connection error found in a header block (code is an HTTP/2 error code)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class HeaderReader:
    """Reassembles and decodes the header blocks of one connection."""

    __slots__ = ("limits", "decoder", "cache", "generation", "block", "stream_id", "flags", "frames")

    def __init__(self, limits: Http2Limits):
        self.limits = limits
        # The hard limit bounds what decoding may build; the soft one is checked per request.
        self.decoder = hpack.Decoder(max_header_list_size=limits.hard_header_list_size)
        self.cache: dict[bytes, tuple] = {}
        self.generation = 0
        self.block: Optional[bytearray] = None  # a block waiting for CONTINUATION frames
        self.stream_id = 0
        self.flags = 0
        self.frames = 0

    def begin(self, stream_id: int, flags: int, fragment: bytes) -> None:
        """HEADERS without END_HEADERS: the block continues in CONTINUATION frames."""
        self._check_size(len(fragment))
        self.block = bytearray(fragment)
        self.stream_id = stream_id
        self.flags = flags
        self.frames = 1

    def continuation(self, stream_id: int, fragment: bytes, last: bool) -> Optional[bytes]:
        """Add a CONTINUATION fragment; the whole block once `last`, else None."""
        block = self.block
        if block is None or stream_id != self.stream_id:
            raise HeaderError(PROTOCOL_ERROR, "unexpected CONTINUATION frame")
        self.frames += 1
        if self.frames > self.limits.max_header_frames:
            raise HeaderError(ENHANCE_YOUR_CALM, "too many CONTINUATION frames in one header block")
        block += fragment
        self._check_size(len(block))
        if not last:
            return None
        self.block = None
        return bytes(block)

    def _check_size(self, n: int) -> None:
        if n > self.limits.hard_header_list_size:
            raise HeaderError(ENHANCE_YOUR_CALM, f"header block of more than {self.limits.hard_header_list_size} bytes")

    def decode(self, block: bytes) -> tuple[list, int]:
        """(raw (name, value) pairs, header list size as RFC 7541 counts it)."""
        cached = self.cache.get(block)
        if cached is not None and cached[0] == self.generation:
            return cached[1], cached[2]
        table = self.decoder.header_table
        entries = table.dynamic_entries
        before = (len(entries), entries[0] if entries else None, table.maxsize)
        try:
            headers = self.decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            # Also a list over the hard limit: the decoder's table may be half updated, so
            # the connection cannot go on.
            raise HeaderError(COMPRESSION_ERROR, f"cannot decode header block: {exc}") from None
        size = 0
        for name, value in headers:
            size += len(name) + len(value) + 32
        after = (len(entries), entries[0] if entries else None, table.maxsize)
        if after[0] != before[0] or after[1] is not before[1] or after[2] != before[2]:
            # The block changed the decoder's table: earlier cache entries may now decode differently.
            self.generation += 1
            self.cache.clear()
        elif len(block) <= CACHE_BLOCK_BYTES and len(self.cache) < CACHE_ENTRIES:
            self.cache[block] = (self.generation, headers, size)
        return headers, size
