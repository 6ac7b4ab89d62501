"""The responses of `await request.async_exec(decoupled=True)`, as they arrive.

The awaited call resolves once the first response is there (as Triton's does).
Iterate with `async for` inside an `async def execute`: each response is
yielded when it arrives, the callee's empty final one included, and the
iteration ends after it. A plain `for` works too, as over Triton's
ResponseIterator (its documented async BLS example iterates that way): a
response not there yet is then waited for on the spot. `cancel()` asks the
callee to stop (its `request.is_cancelled()` turns true); the stream still
ends with the callee's final response.
"""

from __future__ import annotations

import asyncio
import collections
import threading

import triton_python_backend_utils as pb_utils


class AsyncResponseStream:
    def __init__(self, client, key: int, loop: asyncio.AbstractEventLoop):
        self._client = client
        self._key = key
        self._loop = loop
        self._items: collections.deque = collections.deque()
        self._ended = False
        self._waiter: asyncio.Future | None = None
        self._arrived = threading.Event()  # for a plain `for` on a thread of the model's own

    def deliver(self, response, final: bool) -> None:
        """A response for this stream (on the worker's loop, or the thread pumping for it)."""
        self._items.append(response)
        if final:
            self._ended = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._arrived.set()

    def _ready(self) -> bool:
        return bool(self._items) or self._ended

    async def first(self) -> None:
        """Wait, without holding the loop, until the first response (or the end) is there."""
        while not self._ready():
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    # ---- async for ----------------------------------------------------------------

    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    # ---- plain for --------------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):
        if not self._ready():
            self._wait()
        if self._items:
            return self._items.popleft()
        raise StopIteration

    def _wait(self) -> None:
        worker = self._client.worker
        if worker.pumping_here():
            worker.wait_inline(self._ready)
        elif _on_thread_of(self._loop):
            if not worker.hold_loop_until(self._ready):
                raise pb_utils.TritonModelException(
                    "the BLS response stream cannot be waited for here; iterate it with 'async for'"
                )
        else:
            while not self._ready():
                self._arrived.wait(0.05)
                self._arrived.clear()

    def cancel(self) -> None:
        """Ask the callee to stop; a no-op once the stream has ended."""
        if not self._ended:
            self._client.cancel(self._key)


def _on_thread_of(loop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
