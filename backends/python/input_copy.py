"""How a batch's large inputs reach the link's arena: copied on the loop, or beside it.

RequestPath reserves a region per input over wire.INLINE_LIMIT while it encodes the batch, then
fills them: on the loop when they are small in all (under a millisecond), on a thread past
COPY_BESIDE_BYTES, where numpy copies without the GIL (a memoryview slice assignment holds it).

An input still in a client's system shared-memory region (kernel.core.shared_memory.InputWindow:
the core leaves those to backends that take them, BackendInstance.takes_input_windows) is read
straight from the client's object into its region with pread: one copy in all, into memory that
is already mapped, instead of a read into a new buffer and a copy from it. A client that shrank
its object before the batch is made has its request answered with the error and left out of the
batch (window_error); one that shrinks it during the read gets the error too and is left out of
the batch as well, before the batch is written (RequestPath._leave_out): the rest of it goes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional

import numpy as np

from kernel.backends.python import messages
from kernel.backends.python.arena import Arena
from kernel.core.errors import KernelError
from kernel.core.shared_memory import InputWindow

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
    copies: list  # (region view, source bytes or InputWindow, request key) each
    copy_bytes: int
    arena: Arena
    epoch: object


def running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def window_error(request) -> Optional[KernelError]:
    """The error of the first input whose client object no longer holds its window (the client
    shrank it after the request came), checked before any region is reserved for the request."""
    for t in request.inputs:
        window = t._raw
        if type(window) is InputWindow and not window.fits():
            return window.region.shrunk(window.at, window.nbytes)
    return None


def copy_here(copies: list) -> Optional[dict]:
    """Fill the regions on the loop; the keys of requests whose shared-memory input was cut short
    meanwhile (the rest of its region zeroed), with their errors, or None."""
    return _fill(copies, _assign)


def copy_beside(copies: list) -> Optional[dict]:
    """copy_here on a thread: numpy's copy and pread let go of the GIL (a memoryview slice
    assignment holds it)."""
    return _fill(copies, _copyto)


def _assign(region, data) -> None:
    region[:] = data


def _copyto(region, data) -> None:
    np.copyto(np.frombuffer(region, np.uint8), np.frombuffer(data, np.uint8))


def _fill(copies: list, copy) -> Optional[dict]:
    void = None
    for region, data, key in copies:
        if type(data) is InputWindow:
            error = data.fill(region)  # straight from the client's object: the one copy
            if error is not None:
                void = void or {}
                void[key] = error
        else:
            copy(region, data)
    return void
