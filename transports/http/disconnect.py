"""Cancelling a request whose HTTP client went away (the model sees is_cancelled())."""

from __future__ import annotations

import asyncio
from typing import Callable

from kernel.core.request import InferRequest


class DisconnectWatch:
    """Waits in receive() for the client's disconnect; then cancels `request` and calls on_disconnect().

    With start_after > 0 the waiting task starts only once the request has run that long: most
    infer requests are answered first, and a timer costs far less than a task created and
    cancelled on every request. A disconnect before then is still seen when the task starts.
    """

    __slots__ = ("_receive", "_request", "_on_disconnect", "_timer", "_task")

    def __init__(self, receive, request: InferRequest, on_disconnect: Callable[[], None],
                 start_after: float = 0.0) -> None:
        self._receive = receive
        self._request = request
        self._on_disconnect = on_disconnect
        self._task = None
        self._timer = None
        if start_after > 0:
            self._timer = asyncio.get_running_loop().call_later(start_after, self._start)
        else:
            self._start()

    def _start(self) -> None:
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._request.cancel()
                self._on_disconnect()
                return

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
