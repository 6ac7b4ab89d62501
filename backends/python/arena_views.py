"""The front's side of tensors that come back from a worker through an arena: views, not copies.

A worker's output above the inline limit arrives as a location: in the worker's arena (the
worker copied the model's array there: the one copy out), or, for an output that is a view of
the request's own input (an identity model's), in the front's own arena (`Tensor.owner` >= 0:
no copy at all). Either way the transport gets a read-only-by-convention view of that memory as
the tensor's `raw`, and the region stays reserved until the last object that can reach those
bytes is gone: the transport has written the response to its socket and dropped it. Only then
is the worker's region released (one Release message per loop iteration) or the front's own
region freed (if the worker, too, has given it back: free_inputs). Holding instead of copying is
what keeps an arena region from being reused while a response made of it is still going out.

How "gone" is seen: the view is `memoryview(arr)` for an ndarray `arr` made over the mapping;
every memoryview or ndarray derived from it keeps `arr` alive (buffer exports hold their
exporter), so a weak reference to `arr` fires exactly when no reader is left.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Callable, Optional

import numpy as np

from kernel.backends.python.arena import Arena, PeerArena
from kernel.core.request import InferTensor


class ArenaViews:
    """Output views of one worker generation: what they hold, and giving it back."""

    def __init__(self, arena: Arena, peer: PeerArena, send_release: Callable[[list], None]):
        self._arena = arena
        self._peer = peer
        self._send_release = send_release  # Release((segment, offset), ...) to the worker
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread = 0
        self._refs: dict[int, tuple] = {}  # id(weakref) -> (weakref, on_gone, region)
        self._pins: dict[tuple[int, int], int] = {}  # own regions -> live views of them
        self._ended: set[tuple[int, int]] = set()  # own regions the worker gave back while pinned
        self._releases: list[tuple[int, int]] = []
        self._flush_handle = None
        self.closed = False

    @property
    def live(self) -> int:
        """Views handed out and not yet gone (tests, diagnostics)."""
        return len(self._refs)

    def unpack(self, t, request_regions) -> InferTensor:
        """The core's tensor for a worker's message tensor; request_regions: the request's own
        input regions in the front's arena (only those may be referenced). ValueError: a location
        that is not the worker's to give."""
        if t.data is not None:
            return InferTensor(t.name, t.datatype, t.shape, raw=t.data)
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        if t.nbytes < 0 or t.offset < 0:
            raise ValueError("arena region out of bounds")
        if t.owner >= 0:
            region = (t.segment, t.owner)
            size = self._arena.size_of(t.segment, t.owner) if request_regions and region in request_regions else 0
            if not size or t.offset < t.owner or t.offset + t.nbytes > t.owner + size:
                raise ValueError("an output refers to front memory that is not one of the request's inputs")
            arr = np.frombuffer(self._arena.segments[t.segment].map, np.uint8, t.nbytes, t.offset)
            self._pins[region] = self._pins.get(region, 0) + 1
            self._watch(arr, self._unpin, region)
        else:
            self._peer.view(t.segment, t.offset, t.nbytes)  # bounds check (ValueError)
            arr = np.frombuffer(self._peer.segments[t.segment].map, np.uint8, t.nbytes, t.offset)
            self._watch(arr, self._release, (t.segment, t.offset))
        return InferTensor(t.name, t.datatype, t.shape, raw=memoryview(arr))

    def free_inputs(self, regions) -> None:
        """The worker is done with these regions of the front's arena (its last array over each is
        gone: request inputs, BLS outputs): free them, or leave that to the last view of one."""
        if not regions:
            return
        for region in regions:
            if region in self._pins:
                self._ended.add(region)
            else:
                self._arena.free(*region)

    def close(self) -> None:
        """The worker is gone: views still out keep their mappings, nothing is given back."""
        self.closed = True
        self._refs.clear()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

    # ---- the last view of a region is gone --------------------------------

    def _watch(self, arr: np.ndarray, on_gone, region) -> None:
        ref = weakref.ref(arr, self._gone)
        self._refs[id(ref)] = (ref, on_gone, region)

    def _gone(self, ref) -> None:
        entry = self._refs.pop(id(ref), None)
        if entry is None or self.closed:
            return
        if threading.get_ident() == self._loop_thread:
            entry[1](entry[2])
        else:  # dropped by another thread (a garbage collection there): the loop owns the arenas
            try:
                self._loop.call_soon_threadsafe(entry[1], entry[2])
            except RuntimeError:  # the loop is closed: the server is gone, and the arenas with it
                pass

    def _unpin(self, region) -> None:
        left = self._pins[region] - 1
        if left:
            self._pins[region] = left
            return
        del self._pins[region]
        if region in self._ended and not self.closed:
            self._ended.discard(region)
            self._arena.free(*region)

    def _release(self, region) -> None:
        if self.closed:
            return
        self._releases.append(region)
        if self._flush_handle is None:
            # Views usually go together (a response's outputs): one Release for all of them.
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        releases, self._releases = self._releases, []
        if releases and not self.closed:
            try:
                self._send_release(releases)
            except ConnectionError:
                pass
