"""The one thread that runs a synchronous model's initialize/execute/finalize.

Lighter than a ThreadPoolExecutor on the per-request path: a SimpleQueue in,
one call_soon_threadsafe out, no concurrent.futures chaining.
"""

from __future__ import annotations

import asyncio
import queue
import threading


class ModelThread:
    def __init__(self, loop: asyncio.AbstractEventLoop, name: str = "execute"):
        self._loop = loop
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, *args) -> asyncio.Future:
        """Run fn(*args) on the model thread; the future resolves on the loop."""
        fut = self._loop.create_future()
        self._queue.put((fn, args, _resolve, fut))
        return fut

    def call(self, fn, args: tuple, done, context) -> None:
        """Run fn(*args) on the model thread, then done(context, result, exc) on the loop.

        The request path uses this: no future, one hop each way.
        """
        self._queue.put((fn, args, done, context))

    def _run(self) -> None:
        get = self._queue.get
        call = self._loop.call_soon_threadsafe
        while True:
            item = get()
            if item is None:
                return
            fn, args, done, context = item
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the loop
                call(done, context, None, exc)
            else:
                call(done, context, result, None)

    def stop(self) -> None:
        self._queue.put(None)


def _resolve(fut: asyncio.Future, result, exc) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
