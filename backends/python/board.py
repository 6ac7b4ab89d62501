"""A worker's load board: how many requests it holds, in shared memory every front reads.

Why: with several front processes in front of one worker (worker links, worker_links.py), a front
that picks an instance for a request must know what the others gave it too; asking would add a
round trip per request. So the worker publishes its counts in one small memfd, written by the
worker only and mapped read-only by each front (and the primary), and a front reads them as
plain memory (a few tens of nanoseconds) when it dispatches. The board exists only once a worker
has a link besides the primary: a single front never pays for it.

Layout: int64 slots. HELD (0): requests received and not yet finally answered, all links;
EXECUTING (1): Execute messages received whose execute() has not finished; LINK0 + link (2..256):
the held requests of each link. Plain aligned 8-byte stores and loads: a reader may see one
update late, never a torn value (the counts steer dispatch; nothing is counted from them).
"""

from __future__ import annotations

import mmap
import os

HELD, EXECUTING, LINK0 = 0, 1, 2
SIZE = 4096  # one page: 2 + 255 slots of 8 bytes fit


class Board:
    """The worker's side: it owns the memfd and writes the counts (on its loop only)."""

    def __init__(self, name: str = "kernel-board"):
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(self.fd, SIZE)
        self._map = mmap.mmap(self.fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.slots = memoryview(self._map).cast("q")

    def received(self, link: int, n: int) -> None:
        """n requests of `link` arrived in one Execute."""
        slots = self.slots
        slots[LINK0 + link] += n
        slots[HELD] += n
        slots[EXECUTING] += 1

    def answered(self, link: int, n: int) -> None:
        """n requests of `link` had their final response sent."""
        if n:
            slots = self.slots
            slots[LINK0 + link] = max(0, slots[LINK0 + link] - n)
            slots[HELD] = max(0, slots[HELD] - n)

    def executed(self, n: int) -> None:
        """n Execute messages' execute() finished."""
        slots = self.slots
        slots[EXECUTING] = max(0, slots[EXECUTING] - n)

    def forget(self, link: int) -> None:
        """A link is gone: what it held is no longer waited for by anyone."""
        slots = self.slots
        slots[HELD] = max(0, slots[HELD] - slots[LINK0 + link])
        slots[LINK0 + link] = 0


class BoardView:
    """A front's side: the worker's board mapped read-only."""

    def __init__(self, fd: int, size: int):
        try:
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        self.slots = memoryview(self._map).cast("q")

    def others(self, link: int) -> int:
        """Requests the worker holds for every link but `link` (whose own count the caller knows better)."""
        slots = self.slots
        return max(0, slots[HELD] - slots[LINK0 + link])

    def held(self) -> int:
        return self.slots[HELD]

    def executing(self) -> int:
        return self.slots[EXECUTING]

    def close(self) -> None:
        try:
            self.slots.release()
            self._map.close()
        except BufferError:
            pass
