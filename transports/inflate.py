"""Inflating a compressed request (an HTTP body, a gRPC message): linear work, bounded output,
bounded gzip members, and no long stretch of it on the event loop.

Why (issue 31, N1): each gzip member's end left zlib a copy of everything after it
(`unused_data`), and the next member started from that copy, so a body of 20-byte empty members
cost time in the square of its size: 4 MiB froze the front for ~38 s, HTTP and gRPC alike.

How:

* The input goes to zlib in pieces that start at FIRST_PIECE bytes with each member and double
  while the member goes on (up to MAX_PIECE). What zlib copies at a member's end is the rest of
  the last piece, at most about twice what the member itself took, so the whole body costs time
  in proportion to its size.
* Each call to zlib makes at most MAX_OUT bytes, and the output stops one byte past `limit`:
  a few KB that would inflate to gigabytes are refused after `limit` bytes.
* A gzip body may hold at most MAX_MEMBERS members (RFC 1952 lets them concatenate; each costs a
  zlib set-up of a few microseconds). Anything after the last complete stream, or a stream cut
  short, is an error rather than ignored.
* `Inflation.run(budget)` stops after about `budget` bytes of work (input read, output made,
  MEMBER_WORK per member) and resumes where it stopped. Callers run a first slice on the loop,
  where the common small body finishes, and the rest on a thread beside it (`beside_loop`):
  zlib lets go of the GIL while it inflates, and the Python between two calls is short.
"""

from __future__ import annotations

import asyncio
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

FIRST_PIECE = 64
MAX_PIECE = 1 << 20
MAX_OUT = 1 << 20
MAX_MEMBERS = 4096
# A member's zlib set-up counted as this many bytes of work (~2 us at ~1 GB/s).
MEMBER_WORK = 2048
# Work done on the loop before the rest goes beside it: well under a millisecond.
INLINE_WORK = 256 * 1024
THREADS = 2

_GZIP_MAGIC = b"\x1f\x8b"
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
ENCODINGS = frozenset(_WBITS)


class InflateError(Exception):
    """Why the data cannot be inflated. `bound` names the limit it broke ("size": the output
    passed `limit`, `size` holding what was made; "members": more than MAX_MEMBERS), or is
    None for data that is not a valid stream."""

    def __init__(self, message: str, bound: Optional[str] = None, size: int = 0):
        super().__init__(message)
        self.bound = bound
        self.size = size


class Inflation:
    """One body being inflated; `run` it (in slices if need be), then take `result()`."""

    __slots__ = ("view", "encoding", "wbits", "limit", "max_members", "pos", "piece", "inflater", "full",
                 "members", "parts", "size", "done", "cancelled")

    def __init__(self, data, encoding: str, limit: int, max_members: int = MAX_MEMBERS):
        wbits = _WBITS.get(encoding)
        if wbits is None:
            raise ValueError(f"unsupported encoding {encoding!r}")
        view = memoryview(data)
        self.view = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        self.encoding = encoding
        self.wbits = wbits
        self.limit = limit
        self.max_members = max_members
        self.pos = 0  # input handed to zlib so far (less what it gave back at a stream's end)
        self.piece = FIRST_PIECE
        self.inflater = zlib.decompressobj(wbits)
        self.full = False  # the last call filled its output: zlib may have more without new input
        self.members = 1
        self.parts: list = []
        self.size = 0
        self.done = False
        self.cancelled = False  # set from the loop when nobody wants the result any more

    def run(self, budget: Optional[int] = None) -> bool:
        """Inflate until the end (True) or until about `budget` bytes of work are done (False;
        call again to go on). Raises InflateError."""
        view = self.view
        n = len(view)
        d = self.inflater
        work = 0
        while not self.done:
            if self.cancelled:
                self.parts = []
                return True
            if budget is not None and work >= budget:
                return False
            tail = d.unconsumed_tail
            if tail:
                data = tail
            elif self.full:
                data = b""
            else:
                if self.pos >= n:
                    raise InflateError(f"the {self.encoding} stream is incomplete")
                data = view[self.pos : self.pos + self.piece]
                self.pos += len(data)
                if self.piece < MAX_PIECE:
                    self.piece <<= 1
            want = self.limit + 1 - self.size
            if want > MAX_OUT:
                want = MAX_OUT
            try:
                out = d.decompress(data, want)
            except zlib.error as exc:
                raise InflateError(str(exc)) from None
            self.full = len(out) == want
            work += len(data) + len(out)
            if out:
                self.size += len(out)
                if self.size > self.limit:
                    raise InflateError(f"inflated size over {self.limit} bytes", "size", self.size)
                self.parts.append(out)
            elif tail and len(d.unconsumed_tail) == len(tail):
                raise InflateError("the stream makes no progress")  # (zlib always does; never loop)
            if d.eof:
                d = self._next_member()
                work += MEMBER_WORK
        return True

    def _next_member(self):
        """A stream just ended: done, or the next gzip member's inflater."""
        d = self.inflater
        self.pos -= len(d.unused_data)  # what zlib read past the end goes back to the input
        rest = len(self.view) - self.pos
        if not rest:
            self.done = True
            return d
        if self.encoding != "gzip" or self.view[self.pos : self.pos + 2] != _GZIP_MAGIC:
            raise InflateError(f"{rest} bytes follow the {self.encoding} stream")
        if self.members >= self.max_members:
            raise InflateError(f"the body holds more than {self.max_members} gzip members", "members")
        self.members += 1
        self.piece = FIRST_PIECE
        self.full = False
        self.inflater = d = zlib.decompressobj(self.wbits)
        return d

    def result(self) -> bytes:
        parts = self.parts
        self.parts = []
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)


_pool: Optional[ThreadPoolExecutor] = None


def _finish(job: Inflation) -> bytes:
    job.run()
    return job.result()


def beside_loop(job: Inflation) -> asyncio.Future:
    """The rest of `job` on the inflating threads; a future of the running loop with its result
    (InflateError when the data is bad or too large). Cancelling the future stops the work at
    its next piece."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="kernel-inflate")
    future = asyncio.get_running_loop().run_in_executor(_pool, _finish, job)
    future.add_done_callback(lambda f: f.cancelled() and setattr(job, "cancelled", True))
    return future


async def inflate(data, encoding: str, limit: int) -> bytes:
    """`data` inflated: on the loop when that is quick, beside it otherwise. Raises InflateError."""
    job = Inflation(data, encoding, limit)
    if job.run(INLINE_WORK):
        return job.result()
    future = beside_loop(job)
    try:
        return await future
    except asyncio.CancelledError:
        job.cancelled = True
        raise
