"""Hands work from one thread to an event loop running on another.

Every finished batch (or decoupled yield) is appended to one queue; the loop is
woken with call_soon_threadsafe only when no wake-up is already on its way, so
a burst of results costs one self-pipe write, not one per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Callable

log = logging.getLogger("kernel.callable")


class LoopInbox:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._items: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._wake_pending = False

    def post(self, handler: Callable[[Any], None], item: Any) -> None:
        """Run handler(item) on the front loop soon. Safe from any thread."""
        self._items.append((handler, item))
        # Append first, then look at the flag: a drain that already cleared it
        # either sees this item or a new wake-up is scheduled below.
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: the server is gone
                self._wake_pending = False

    def _drain(self) -> None:
        self._wake_pending = False
        items = self._items
        while items:
            handler, item = items.popleft()
            try:
                handler(item)
            except Exception:  # noqa: BLE001 - one bad delivery must not stop the others
                log.exception("delivering a callable's results failed")
