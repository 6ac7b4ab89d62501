"""Bytes the server holds on behalf of clients, with a global bound and a stall timeout.

Why: an answer waits in memory until its client reads it (an arena region behind a view, a
transport's write buffer, an HTTP/2 stream's queue), and a request waits in memory until its
client has sent all of it. A client that stops reading (a zero HTTP/2 window, a socket nobody
reads) or stops sending in the middle of a large message would otherwise hold that memory for as
long as it keeps the connection open: a hundred such streams pinned 3.2 GB of a worker's
shared memory (issue 23). Each transport knows what its connections hold; this module keeps the
account for all of them and decides whom to cut.

A transport registers a *holder* (a connection or a stream) only when something did not go at
once: the common request, read in one piece and answered in one write, never comes here. A
holder answers two questions:

- ``held_bytes()``: how many bytes it holds for its client now (0: nothing, it leaves the watch);
- ``cut(reason)``: drop the client (close the connection, reset the stream), which must free
  what it holds, and log or answer with ``reason``.

A sweep runs once a second while anything is watched (no timer at all otherwise). A holder whose
held bytes did not change since the previous sweep is *stalled*; once stalled for
``stall_timeout_s`` it is cut. When the watched holders together hold more than ``limit`` bytes,
the longest-stalled ones are cut first until the total is back under the limit; holders that are
moving are never cut for the total, but while it is over the limit ``over_limit`` is true, and a
transport refuses new work that would add to it (503, naming the limit) instead of holding more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional, Protocol

log = logging.getLogger("kernel.core.holding")

SWEEP_S = 1.0


class Holder(Protocol):
    def held_bytes(self) -> int: ...

    def cut(self, reason: str) -> None: ...


class _Watch:
    __slots__ = ("holder", "last", "since")

    def __init__(self, holder: Holder, held: int, now: float):
        self.holder = holder
        self.last = held  # held bytes at the last sweep
        self.since = now  # when they last changed


class HeldBytes:
    """One account of held bytes (the server keeps one for answers and one for requests)."""

    def __init__(self, what: str, limit: int, stall_timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 sweep_s: float = SWEEP_S):
        if limit <= 0:
            raise ValueError(f"the bound on {what} must be positive, got {limit}")
        if stall_timeout_s <= 0:
            raise ValueError(f"the stall timeout for {what} must be positive, got {stall_timeout_s}")
        self.what = what  # "answers waiting for slow clients", "request bytes from slow clients"
        self.limit = limit
        self.server_limit = 0  # set by share(): the whole server's bound this process holds a part of
        self.stall_timeout_s = stall_timeout_s
        self._clock = clock
        self._sweep_s = sweep_s
        self._watched: dict[int, _Watch] = {}
        self._total = 0  # the sum of `last` over the watched holders, as of the last look
        self._timer: Optional[asyncio.Handle] = None
        self.cut_count = 0  # holders cut so far (statistics, tests)

    # ---- what transports call ------------------------------------------------------

    def watch(self, holder: Holder) -> None:
        """Start watching `holder` (it holds bytes that did not go at once); idempotent and cheap."""
        key = id(holder)
        if key in self._watched:
            return
        held = holder.held_bytes()
        if held <= 0:
            return
        self._watched[key] = _Watch(holder, held, self._clock())
        self._total += held
        if self._total > self.limit:
            # Over the bound: look at everyone again now rather than at the next regular sweep.
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_soon(self.sweep)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._sweep_s, self.sweep)

    def unwatch(self, holder: Holder) -> None:
        """`holder` is gone or holds nothing any more (a closed connection must call this)."""
        entry = self._watched.pop(id(holder), None)
        if entry is not None:
            self._total -= entry.last
            if not self._watched and self._timer is not None:
                self._timer.cancel()
                self._timer = None

    @property
    def over_limit(self) -> bool:
        """The watched holders hold more than the limit: refuse new work that would add to it."""
        return self._total > self.limit

    @property
    def total(self) -> int:
        """Bytes held by the watched holders, as of the last look (sweep or watch)."""
        return self._total

    def share(self, parts: int) -> None:
        """This process holds one of `parts` equal shares of the bound (several front processes:
        the flag states the whole server's bound)."""
        if parts > 1:
            self.server_limit = self.limit
            self.limit = max(1, self.limit // parts)

    def refusal(self) -> str:
        """The message for work refused while over the limit."""
        if self.server_limit:
            return (f"this front process holds {self._total} bytes of {self.what}, over its share ({self.limit} "
                    f"bytes) of the server's limit of {self.server_limit} bytes; try again when they are delivered")
        return (f"the server holds {self._total} bytes of {self.what}, over its limit of {self.limit} "
                "bytes; try again when they are delivered")

    # ---- the sweep -----------------------------------------------------------------

    def sweep(self) -> None:
        if self._timer is not None:  # run early (over the bound, or a caller): no second sweep queued
            self._timer.cancel()
            self._timer = None
        now = self._clock()
        total = 0
        for key, entry in list(self._watched.items()):
            try:
                held = entry.holder.held_bytes()
            except Exception:  # noqa: BLE001 - a holder that cannot answer holds nothing we can free
                log.exception("a holder of %s failed to report", self.what)
                held = 0
            if held <= 0:
                del self._watched[key]
                continue
            if held != entry.last:
                entry.last = held
                entry.since = now
            elif now - entry.since >= self.stall_timeout_s:
                self._cut(key, entry, f"no progress for {now - entry.since:.0f} s while holding {held} bytes of "
                                      f"{self.what} (stall timeout {self.stall_timeout_s:g} s)")
                continue
            total += held
        self._total = total
        if total > self.limit:
            self._enforce_limit(now)
        if self._watched and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._sweep_s, self.sweep)

    def _enforce_limit(self, now: float) -> None:
        """Cut stalled holders, longest-stalled first, until the total is within the limit."""
        stalled = sorted((e for e in self._watched.values() if now - e.since >= self._sweep_s), key=lambda e: e.since)
        for entry in stalled:
            if self._total <= self.limit:
                break
            self._cut(id(entry.holder), entry,
                      f"{self.what} over the limit of {self.limit} bytes; this client held {entry.last} bytes "
                      f"without progress for {now - entry.since:.0f} s")

    def _cut(self, key: int, entry: _Watch, reason: str) -> None:
        if self._watched.pop(key, None) is None:
            return
        self._total -= entry.last
        self.cut_count += 1
        log.warning("cutting a client: %s", reason)
        try:
            entry.holder.cut(reason)
        except Exception:  # noqa: BLE001
            log.exception("cutting a holder of %s failed", self.what)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._watched.clear()
        self._total = 0
