"""A shared-memory arena made of memfd segments, with a first-fit allocator.

Each side of a worker owns one arena and allocates only in it: the front
process writes request tensors into its arena, the worker writes response
tensors into its own. The peer maps the same memfds read/write and reads the
tensors in place. memfds are anonymous, so nothing is left in /dev/shm when a
process dies.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import queue
import socket
import threading
import time

_ALIGN = 64


def _round_up(n: int, align: int = _ALIGN) -> int:
    return (n + align - 1) // align * align


class Segment:
    __slots__ = ("fd", "size", "map", "view", "addr")

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.view = memoryview(self.map)
        # Where the mapping starts in this process: lets the worker tell that a model's output
        # array is a view of an input still in the front's arena (no copy back, see responses.py).
        probe = ctypes.c_char.from_buffer(self.map)
        self.addr = ctypes.addressof(probe)
        del probe  # the buffer export ends here, so the mapping can still be closed

    def close(self) -> None:
        try:
            self.view.release()
            self.map.close()
        except BufferError:
            # A numpy view still points here; the mapping goes when it does.
            pass
        os.close(self.fd)


class _Closer:
    """Closes segments on a thread of its own, so that no event loop waits for it.

    Unmapping a large segment and dropping the last reference to its memfd hand its pages back to
    the kernel: for a 1 GiB segment, ~25-70 ms for the munmap and ~130 ms for the last close on a
    2-core VM, which an idle trim, a model's unload or a peer's SegmentRemoved spent on the loop of
    the process doing it, every client of that front (or every request of that worker) waiting.
    Both calls let go of the GIL. A segment handed over here is already out of its arena's tables;
    the one thread keeps closes in order and is started on first use in each process.
    """

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pid = 0

    def close(self, segments) -> None:
        segments = list(segments)
        if not segments:
            return
        if self._pid != os.getpid():
            self._pid = os.getpid()
            threading.Thread(target=self._run, name="kernel-arena-close", daemon=True).start()
        for seg in segments:
            self._queue.put(seg)

    def _run(self) -> None:
        while True:
            seg = self._queue.get()
            try:
                seg.close()
            except OSError:  # its fd already closed: nothing left to give back
                pass
            del seg


close_segments = _Closer().close


def create_segment(size: int, name: str = "kernel-arena") -> Segment:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return Segment(fd, size)


class FreeList:
    """Free blocks of one region (an arena segment, a worker's block of GPU memory), first fit,
    sorted by offset, coalesced on free."""

    __slots__ = ("offsets", "sizes")

    def __init__(self, size: int):
        self.offsets = [0]
        self.sizes = [size]

    def alloc(self, nbytes: int) -> int:
        sizes = self.sizes
        for i, free in enumerate(sizes):
            if free >= nbytes:
                off = self.offsets[i]
                if free == nbytes:
                    del self.offsets[i]
                    del sizes[i]
                else:
                    self.offsets[i] = off + nbytes
                    sizes[i] = free - nbytes
                return off
        return -1

    def free(self, off: int, nbytes: int) -> None:
        offsets, sizes = self.offsets, self.sizes
        i = bisect.bisect_left(offsets, off)
        # merge with the next block
        if i < len(offsets) and off + nbytes == offsets[i]:
            nbytes += sizes[i]
            del offsets[i]
            del sizes[i]
        # merge with the previous block
        if i > 0 and offsets[i - 1] + sizes[i - 1] == off:
            sizes[i - 1] += nbytes
            return
        offsets.insert(i, off)
        sizes.insert(i, nbytes)

    def whole(self, size: int) -> bool:
        """Nothing of a region of `size` bytes is allocated."""
        return len(self.sizes) == 1 and self.sizes[0] == size


class Arena:
    """The allocating side: segments it created, and where each allocation lives.

    Safe from any thread: a worker's model threads copy their outputs in at `send()` while its
    loop frees what the front gave back (one lock around the free lists and the segment table).

    Segments beyond the first (index 0, kept for the life of the process) are given back once
    idle: a grown segment wholly free for a while is closed (`trim`), so a burst of large tensors
    does not pin its shared memory until the process ends. Segment indices are never reused: the
    peer may still map a closed segment until it has read the SegmentRemoved that says so.
    """

    def __init__(self, default_size: int, growth_size: int, name: str = "kernel-arena"):
        self.default_size = default_size
        self.growth_size = growth_size
        self.name = name
        self.segments: dict[int, Segment] = {}
        self._free: dict[int, FreeList] = {}
        self._sizes: dict[tuple[int, int], int] = {}
        self._next_index = 0
        self._idle_since: dict[int, float] = {}  # grown segments wholly free: since when (time.monotonic)
        self._lock = threading.Lock()
        self.on_new_segment = None  # callback(segment_index, Segment), under the lock: announce to the peer
        self.on_idle = None  # callback(), under the lock: a grown segment became wholly free (arm a trim)

    def _grow(self, nbytes: int) -> int:
        if not self.segments:
            # Segment 0 is kept for good, so it is the default size whatever the first tensor is:
            # a first request of 1 GiB would otherwise pin 1 GiB for the life of the process.
            first = self._new_segment(self.default_size)
            if nbytes <= self.default_size:
                return first
        steps = -(-nbytes // self.growth_size)
        return self._new_segment(max(1, steps) * self.growth_size)

    def _new_segment(self, size: int) -> int:
        seg = create_segment(size, self.name)
        index = self._next_index
        self._next_index += 1
        self.segments[index] = seg
        self._free[index] = FreeList(size)
        if self.on_new_segment is not None:
            self.on_new_segment(index, seg)
        return index

    def alloc(self, nbytes: int) -> tuple[int, int]:
        """Reserve nbytes; returns (segment, offset). Grows the arena when full."""
        size = _round_up(max(nbytes, 1))
        with self._lock:
            for index, free in self._free.items():
                off = free.alloc(size)
                if off >= 0:
                    if self._idle_since:
                        self._idle_since.pop(index, None)
                    self._sizes[(index, off)] = size
                    return index, off
            index = self._grow(size)
            off = self._free[index].alloc(size)
            self._sizes[(index, off)] = size
            return index, off

    def free(self, segment: int, offset: int) -> None:
        with self._lock:
            size = self._sizes.pop((segment, offset), None)
            if size is None:
                return
            free = self._free[segment]
            free.free(offset, size)
            if segment and free.whole(self.segments[segment].size):
                self._idle_since[segment] = time.monotonic()
                if self.on_idle is not None:
                    self.on_idle()

    def trim(self, idle_seconds: float) -> tuple[list[int], float]:
        """Close the grown segments wholly free for idle_seconds or more.

        Returns (the closed indices, to tell the peer; seconds until the next idle segment is due, or 0
        when none is left idle)."""
        removed = []
        due = 0.0
        now = time.monotonic()
        with self._lock:
            for index, since in list(self._idle_since.items()):
                left = since + idle_seconds - now
                if left > 0:
                    due = left if not due else min(due, left)
                    continue
                del self._idle_since[index]
                del self._free[index]
                removed.append(index)
            close_segments([self.segments.pop(index) for index in removed])
        return removed, due

    def write(self, data, nbytes: int) -> tuple[int, int]:
        segment, offset = self.alloc(nbytes)
        self.segments[segment].view[offset : offset + nbytes] = data
        return segment, offset

    def view(self, segment: int, offset: int, nbytes: int) -> memoryview:
        return self.segments[segment].view[offset : offset + nbytes]

    def size_of(self, segment: int, offset: int) -> int:
        """The size of the live allocation at (segment, offset); 0 when there is none."""
        return self._sizes.get((segment, offset), 0)

    @property
    def allocated(self) -> int:
        return sum(self._sizes.values())

    def close(self) -> None:
        with self._lock:
            close_segments(self.segments.values())
            self.segments.clear()
            self._free.clear()
            self._sizes.clear()
            self._idle_since.clear()


class PeerArena:
    """The reading side: segments the peer created, mapped here by fd."""

    def __init__(self):
        self.segments: dict[int, Segment] = {}

    def add(self, index: int, fd: int, size: int) -> None:
        self.segments[index] = Segment(fd, size)

    def receive(self, fd_sock: socket.socket, index: int, size: int) -> None:
        """Map the segment the peer announced (SegmentAdded): its fd is the next on the fd channel."""
        _, fds, _, _ = socket.recv_fds(fd_sock, 1, 1)
        self.add(index, fds[0], size)

    def remove(self, index: int) -> None:
        """The peer closed this segment (it was wholly free): unmap it here too. A view that still
        points into it (none should) keeps the mapping until it is gone (Segment.close)."""
        seg = self.segments.pop(index, None)
        if seg is not None:
            close_segments([seg])

    def view(self, segment: int, offset: int, nbytes: int) -> memoryview:
        try:
            seg = self.segments[segment]
        except KeyError:
            raise ValueError(f"unknown arena segment {segment}") from None
        if offset < 0 or nbytes < 0 or offset + nbytes > seg.size:
            raise ValueError("arena region out of bounds")
        return seg.view[offset : offset + nbytes]

    def close(self) -> None:
        close_segments(self.segments.values())
        self.segments.clear()
