"""Compressed infer answers (--grpc-infer-response-compression-level), as tritonserver sends them.

What tritonserver 2.51 does (its gRPC C-core underneath), checked frame by frame:

* Only ModelInfer and ModelStreamInfer answers are compressed; every other RPC answers plainly.
* The level picks one algorithm among those the client lists in `grpc-accept-encoding` (exact,
  comma-separated names; unknown ones ignored). gzip and deflate are ranked in that order and
  narrowed to the accepted ones: `low` takes the first, `medium` the middle one (index n // 2),
  `high` the last. A client accepting both gets gzip at low and deflate at medium and high; one
  accepting one of them gets that one at every level; a client sending no header, or only
  `identity`, gets an uncompressed answer without `grpc-encoding`. `none` never compresses.
* The algorithm is named in the response headers (`grpc-encoding`). Each message is deflated at
  zlib's default level (gzip wrapper for gzip, zlib wrapper for deflate) and goes compressed
  (flag 1 in its prefix) only when that makes it strictly smaller; otherwise it goes as it was
  (flag 0) under the same headers. An error answered before any message (trailers only) names
  no encoding.

Why some work moves off the loop: deflating 16 MiB takes 0.15-0.2 s for zeros and 0.8-1.7 s for
random float32 on the 2-core development box (10-20 MB/s), which would stop every client of the
front for that long. Messages over INLINE_BYTES (at most ~1 ms of deflate) are compressed on a
small thread pool instead (`beside_loop`): zlib lets go of the GIL while it deflates, so the loop
goes on serving. The pool has at most POOL_THREADS threads, so at most that many messages are
being deflated at once, each making one buffer of at most its own size.
"""

from __future__ import annotations

import asyncio
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

# tritonserver's values, in the order of grpc C-core's levels (0..3).
LEVELS = ("none", "low", "medium", "high")

GZIP = b"gzip"
DEFLATE = b"deflate"
# The candidates, in C-core's order (its "ranking in increasing order of compression").
_RANKED = (GZIP, DEFLATE)
_WBITS = {GZIP: 16 + zlib.MAX_WBITS, DEFLATE: zlib.MAX_WBITS}

# Messages up to this size are compressed on the loop (about 1 ms at worst here, 0.1 ms typical).
INLINE_BYTES = 32 * 1024
POOL_THREADS = max(1, min(4, os.cpu_count() or 1))

_U32 = struct.Struct(">L")


def level_index(level: str) -> int:
    """0..3 for none..high (any case); ValueError naming the values for anything else."""
    try:
        return LEVELS.index(level.lower())
    except (ValueError, AttributeError):
        raise ValueError(
            f"unknown gRPC response compression level '{level}' (choose from {', '.join(LEVELS)})"
        ) from None


class Chooser:
    """The algorithm a call's answers get, from its `grpc-accept-encoding`, for one level.

    Clients send the same few header values on every call, so the answers are remembered (a
    bounded number of them: a client sending ever new values cannot grow this)."""

    __slots__ = ("level", "known")

    MAX_KNOWN = 64

    def __init__(self, level: int):
        self.level = level
        self.known: dict[bytes, Optional[bytes]] = {}

    def __call__(self, accept: Optional[bytes]) -> Optional[bytes]:
        """b"gzip", b"deflate", or None (answer uncompressed, no grpc-encoding header)."""
        if accept is None:
            return None
        try:
            return self.known[accept]
        except KeyError:
            pass
        choice = algorithm_for(self.level, accept)
        if len(self.known) >= self.MAX_KNOWN:
            self.known.clear()
        self.known[accept] = choice
        return choice


def algorithm_for(level: int, accept: bytes) -> Optional[bytes]:
    """grpc C-core's choice for a level among the algorithms a client accepts."""
    if level <= 0:
        return None
    names = {name.strip() for name in accept.split(b",")}
    ranked = [a for a in _RANKED if a in names]
    if not ranked:
        return None
    if level == 1:
        return ranked[0]
    if level == 2:
        return ranked[len(ranked) // 2]
    return ranked[-1]


def message(algorithm: bytes, parts: list, size: int) -> tuple[list, int]:
    """One length-prefixed gRPC message of the `size` bytes in `parts`: compressed (flag 1) when
    that makes it smaller, else `parts` as they are (flag 0, not copied). (chunks, their size)."""
    deflater = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, _WBITS[algorithm])
    out = []
    n = 0
    for part in parts:
        piece = deflater.compress(part)
        if piece:
            out.append(piece)
            n += len(piece)
        if n >= size:
            break  # already no smaller: the message goes as it is
    else:
        piece = deflater.flush()
        n += len(piece)
        if n < size:
            out.append(piece)
            body = out[0] if len(out) == 1 else b"".join(out)
            return [b"\x01" + _U32.pack(n), body], n + 5
    return [b"\x00" + _U32.pack(size), *parts], size + 5


_pool: Optional[ThreadPoolExecutor] = None


def _deflate(job: list):
    algorithm, parts, size = job
    if parts is None:
        return None  # cancelled while it waited for a thread
    return message(algorithm, parts, size)


def beside_loop(algorithm: bytes, parts: list, size: int) -> asyncio.Future:
    """message(algorithm, parts, size) on the compression threads: a future of the running loop.

    The work holds `parts` (and so the buffers they view) until it is done; cancelling the future
    lets go of them at once, also while the work still waits for a thread."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="kernel-grpc-deflate")
    job = [algorithm, parts, size]
    future = asyncio.get_running_loop().run_in_executor(_pool, _deflate, job)
    future.add_done_callback(lambda f: f.cancelled() and job.__setitem__(1, None))
    return future
