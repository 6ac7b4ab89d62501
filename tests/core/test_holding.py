"""kernel.core.holding: bytes held for slow clients, a global bound and a stall timeout."""

from __future__ import annotations

import asyncio

import pytest

from kernel.core.holding import HeldBytes


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Holder:
    def __init__(self, held: int) -> None:
        self.held = held
        self.cut_reason = None

    def held_bytes(self) -> int:
        return self.held

    def cut(self, reason: str) -> None:
        self.cut_reason = reason
        self.held = 0


def account(limit=1000, stall=10.0):
    clock = FakeClock()
    return HeldBytes("answers waiting for slow clients", limit, stall, clock=clock, sweep_s=1.0), clock


async def test_a_holder_that_moves_is_never_cut():
    held, clock = account()
    h = Holder(500)
    held.watch(h)
    for _ in range(20):
        clock.now += 5
        h.held -= 10
        held.sweep()
    assert h.cut_reason is None
    assert held.total == 300
    held.close()


async def test_a_stalled_holder_is_cut_after_the_timeout_and_leaves_the_account():
    held, clock = account(stall=10.0)
    h = Holder(500)
    held.watch(h)
    clock.now += 9
    held.sweep()
    assert h.cut_reason is None
    clock.now += 2
    held.sweep()
    assert h.cut_reason is not None and "stall timeout 10 s" in h.cut_reason and "500 bytes" in h.cut_reason
    assert held.total == 0 and held.cut_count == 1
    held.close()


async def test_over_the_limit_the_longest_stalled_are_cut_first_and_moving_ones_kept():
    held, clock = account(limit=1000, stall=600)
    oldest, newer, moving = Holder(600), Holder(600), Holder(600)
    held.watch(oldest)
    clock.now += 5
    held.watch(newer)
    clock.now += 5
    held.watch(moving)  # 1800 held: over the limit, but nobody has been stalled a sweep yet...
    assert held.over_limit
    clock.now += 5
    moving.held -= 1
    held.sweep()  # ...now two are stalled: the oldest goes, which brings the total to 1199: the next too
    assert oldest.cut_reason is not None and "over the limit of 1000 bytes" in oldest.cut_reason
    assert newer.cut_reason is not None
    assert moving.cut_reason is None
    assert held.total == 599 and not held.over_limit
    held.close()


async def test_nothing_held_is_not_watched_and_unwatch_forgets():
    held, clock = account()
    h = Holder(0)
    held.watch(h)
    assert held.total == 0
    h.held = 10
    held.watch(h)
    held.watch(h)  # idempotent
    assert held.total == 10
    held.unwatch(h)
    assert held.total == 0
    held.close()


async def test_the_sweep_timer_runs_only_while_something_is_watched():
    held = HeldBytes("x", 100, 0.05, sweep_s=0.02)
    h = Holder(10)
    held.watch(h)
    assert held._timer is not None
    await asyncio.sleep(0.2)
    assert h.cut_reason is not None  # the real timer swept and cut it
    assert held._timer is None


def test_bounds_must_be_positive():
    with pytest.raises(ValueError, match="must be positive"):
        HeldBytes("x", 0, 1)
    with pytest.raises(ValueError, match="stall timeout"):
        HeldBytes("x", 1, 0)
