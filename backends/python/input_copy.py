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
the batch as well, before the batch is written (leave_out): the rest of it goes.
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


def leave_out(built: Built, void: dict) -> list:
    """Take the requests whose keys are in `void` out of `built` (their shared-memory input was cut
    short while read): (request, its packed inputs, its error) for each, for the caller to answer
    and give back. `built` keeps the rest; with no request left it is not to be sent."""
    taken, kept = [], []
    for key, request, inputs in zip(built.keys, built.requests, built.packed):
        error = void.get(key)
        if error is None:
            kept.append((key, request, inputs))
            continue
        taken.append((request, inputs, error))
        if built.traced is not None and request.trace is not None:
            built.traced = [t for t in built.traced if t is not request.trace] or None
    built.keys, built.requests, built.packed = ([list(column) for column in zip(*kept)] if kept else ([], [], []))
    built.execute.requests = [r for r in built.execute.requests if r.key not in void]
    if built.traced is None:
        built.execute.trace_key = 0
    return taken
