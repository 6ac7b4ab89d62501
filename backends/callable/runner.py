"""The event loop thread that runs async bound callables (one per backend, started on first use)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Awaitable, Callable, Optional

import uvloop

from kernel.backends.callable.inbox import LoopInbox

log = logging.getLogger("kernel.callable")


class AsyncRunner:
    def __init__(self, name: str = "kernel-async-callables"):
        self._name = name
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._inbox: Optional[LoopInbox] = None
        self._tasks: set[asyncio.Task] = set()
        self._lock = threading.Lock()

    def ensure_started(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            ready = threading.Event()

            def main() -> None:
                loop = uvloop.new_event_loop()
                asyncio.set_event_loop(loop)
                self._loop = loop
                self._inbox = LoopInbox(loop)
                ready.set()
                try:
                    loop.run_forever()
                finally:
                    for task in asyncio.all_tasks(loop):
                        task.cancel()
                    loop.run_until_complete(asyncio.sleep(0))
                    loop.close()

            self._thread = threading.Thread(target=main, name=self._name, daemon=True)
            self._thread.start()
            ready.wait()

    @property
    def loop(self) -> Optional[asyncio.AbstractEventLoop]:
        """The runner's event loop once started (remote binding runs its connections on it)."""
        return self._loop

    def spawn(self, coroutine_fn: Callable[[Any], Awaitable[None]], arg: Any) -> None:
        """Start coroutine_fn(arg) as a task on the runner's loop. Safe from any thread."""
        self._inbox.post(self._start_task, (coroutine_fn, arg))

    def _start_task(self, item) -> None:
        coroutine_fn, arg = item
        task = self._loop.create_task(coroutine_fn(arg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def wait_for(self, awaitable: Awaitable) -> Any:
        """Run an awaitable on the runner's loop and block the calling (non-loop) thread until it is done."""
        self.ensure_started()

        async def run():
            return await awaitable

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def stop(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._thread = None
        if loop is not None and thread is not None:
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:
                pass
            thread.join(5)
