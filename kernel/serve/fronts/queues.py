"""What every front holds queued for its dynamically batched models, in one page of shared memory
per model: how a model's max_queue_size bounds the server's queue, not each front's.

A front's DynamicBatcher batches its own requests (the worker merges the batches that wait for it,
across fronts), so the requests waiting for a batch sit in N queues. Each front writes its own
queue lengths (one slot per priority level) after every change; a front checks a new request
against the sum of every front's. Plain 8-byte stores and loads, one writer per slot: a check can
miss a request another front queued in the same instant, so a queue can overshoot its bound by at
most the fronts that admitted at once (N - 1), never more. The supervisor owns the memfd, gives
each such model version a block, and clears a dead front's slots.
"""

from __future__ import annotations

import mmap
import os

FRONTS = 256  # slots per block: front index 0..255 (0 unused: the supervisor runs no batcher for clients)
LEVELS = 16  # priority levels kept apart; higher ones share the last slot
BLOCK = FRONTS * LEVELS  # int64 slots per model version
BLOCKS = 128
SIZE = BLOCK * BLOCKS * 8


def needs_board(model) -> bool:
    """A dynamically batched version with a max_queue_size anywhere."""
    cfg = model.config
    if cfg.WhichOneof("scheduling_choice") != "dynamic_batching":
        return False
    db = cfg.dynamic_batching
    return bool(db.default_queue_policy.max_queue_size or any(
        p.max_queue_size for p in db.priority_queue_policy.values()))


class _Mapped:
    def __init__(self, fd: int, writable: bool):
        self._map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.slots = memoryview(self._map).cast("q")


class QueueBoards(_Mapped):
    """The supervisor's side: the memfd, its blocks, and clearing a dead front's slots."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("kernel-queues", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, SIZE)
        super().__init__(self.fd, True)
        self._free = list(range(BLOCKS - 1, -1, -1))
        self._owner: dict[int, int] = {}  # model uid -> block

    def block_for(self, uid: int) -> int:
        """The block of model version `uid` (-1 when all are taken: that version's bound is per front)."""
        block = self._owner.get(uid)
        if block is None:
            if not self._free:
                return -1
            block = self._owner[uid] = self._free.pop()
            start = block * BLOCK
            self.slots[start:start + BLOCK] = memoryview(bytes(BLOCK * 8)).cast("q")
        return block

    def release(self, uid: int) -> None:
        block = self._owner.pop(uid, None)
        if block is not None:
            self._free.append(block)

    def clear_front(self, front: int) -> None:
        """A front is gone: what it had queued is not waiting any more."""
        for block in self._owner.values():
            start = block * BLOCK + front * LEVELS
            self.slots[start:start + LEVELS] = memoryview(bytes(LEVELS * 8)).cast("q")


class FrontQueues(_Mapped):
    """A front's mapping of the board."""

    def __init__(self, fd: int, front: int, fronts: int):
        super().__init__(fd, True)
        os.close(fd)
        self.front = front
        self.fronts = fronts

    def board(self, block: int) -> "QueueBoard":
        return QueueBoard(self.slots, block, self.front, self.fronts)


class QueueBoard:
    """One model version's block, as its DynamicBatcher in one front uses it (queue_board)."""

    __slots__ = ("_slots", "_mine", "_base", "_others")

    def __init__(self, slots: memoryview, block: int, front: int, fronts: int):
        self._slots = slots
        self._base = block * BLOCK
        self._mine = self._base + front * LEVELS
        self._others = [self._base + f * LEVELS for f in range(1, fronts + 1) if f != front]

    def publish(self, counts: list[int]) -> None:
        slots, mine = self._slots, self._mine
        for i, count in enumerate(counts[:LEVELS - 1]):
            slots[mine + i] = count
        if len(counts) >= LEVELS:
            slots[mine + LEVELS - 1] = sum(counts[LEVELS - 1:])

    def others(self, index: int) -> int:
        slots = self._slots
        i = min(index, LEVELS - 1)
        return sum(slots[base + i] for base in self._others)

    def others_total(self) -> int:
        """The other fronts' queued requests at every level."""
        slots = self._slots
        return sum(sum(slots[base:base + LEVELS]) for base in self._others)
