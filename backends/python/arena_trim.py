"""Giving idle arena segments back: both owners (the front's input arena, a worker's output arena).

A burst of large tensors grows an arena by whole segments (shm-growth-byte-size each), and the
peer maps every one of them. Without this, one slow client holding a hundred 32 MiB responses
would pin 3.2 GB of shared memory in both processes for as long as they live. A grown segment
(never the first) that has been wholly free for `idle_seconds` is closed, and the peer is told
(SegmentRemoved) so that it unmaps it too.

Cheap by construction: the arena reports only the moment a grown segment falls wholly free
(Arena.on_idle); that arms one loop timer, and the timer re-arms itself only while some segment
is idle but not yet due. No work per request, no timer while nothing is idle.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable, Optional

from kernel.backends.python.arena import Arena

# Default for the python backend setting shm-idle-release-seconds (Kernel only): long enough that
# steady traffic with pauses does not close and re-create (and page-fault in) segments each time.
DEFAULT_IDLE_SECONDS = 5.0


class IdleTrim:
    def __init__(self, arena: Arena, loop: asyncio.AbstractEventLoop, idle_seconds: float,
                 send_removed: Callable[[int], None], before: Optional[Callable[[], None]] = None):
        """send_removed(index): tell the peer (on the loop); before(): called first on each check
        (the worker announces segments still unannounced, so none is closed unannounced).
        idle_seconds <= 0: never trim."""
        self._arena = arena
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self.idle_seconds = idle_seconds
        self._send_removed = send_removed
        self._before = before
        self._armed = False
        if idle_seconds > 0:
            arena.on_idle = self._on_idle

    def _on_idle(self) -> None:
        """A grown segment fell wholly free (under the arena's lock, on any thread)."""
        if self._armed:
            return
        self._armed = True
        if threading.get_ident() == self._loop_thread:
            self._loop.call_later(self.idle_seconds, self._check)
        else:
            self._loop.call_soon_threadsafe(self._loop.call_later, self.idle_seconds, self._check)

    def _check(self) -> None:
        self._armed = False
        try:
            if self._before is not None:
                self._before()
            removed, due = self._arena.trim(self.idle_seconds)
            for index in removed:
                self._send_removed(index)
        except OSError:  # the peer is gone: nothing to tell, nothing left to trim for
            return
        if due and not self._armed:
            self._armed = True
            self._loop.call_later(due, self._check)
