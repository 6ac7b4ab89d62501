"""How a batch's large inputs reach the link's arena: copied on the loop, or beside it.

RequestPath reserves a region per input over wire.INLINE_LIMIT while it encodes the batch, then
fills them: on the loop when they are small in all (under a millisecond), on a thread past
COPY_BESIDE_BYTES, where numpy copies without the GIL (a memoryview slice assignment holds it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional

import numpy as np

from kernel.backends.python import messages
from kernel.backends.python.arena import Arena

# A batch whose large inputs add up to more than this is copied into the arena beside the loop.
# Below it the copy takes the loop under a millisecond (~9 GB/s here), less than the thread's round trip.
COPY_BESIDE_BYTES = 8 << 20


@dataclass
class Built:
    """A batch encoded for the worker, its large inputs' regions reserved but not yet filled."""

    requests: list
    execute: messages.Execute
    keys: list
    packed: list
    traced: Optional[list]
    trace_key: int
    in_arena: bool
    copies: list  # (region view, source bytes) each
    copy_bytes: int
    arena: Arena
    epoch: object


def running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def copy_here(copies: list) -> None:
    for region, data in copies:
        region[:] = data


def copy_beside(copies: list) -> None:
    """On a thread: numpy's copy lets go of the GIL (a memoryview slice assignment holds it)."""
    for region, data in copies:
        np.copyto(np.frombuffer(region, np.uint8), np.frombuffer(data, np.uint8))
