"""Cancelled requests a model stays silent on are answered by the front after a grace period.

Why: some models never answer some requests (a decoupled model that never sends, a non-decoupled
one that returns None and forgets its response senders, an execute() that never returns). When the
client gives up (a gRPC cancel, a closed connection) the model sees `request.is_cancelled()`; if it
still sends nothing, the request would stay pending in the front for good: counted as pending,
holding shutdown for its whole exit timeout. CANCEL_GRACE_S after the cancellation, or after the
model's latest response for it, such a request is answered CANCELLED here and forgotten.

A model that does answer within the grace (a decoupled callee ending its stream with its own final
response, say) is unaffected. One loop timer while cancelled requests are pending, none otherwise.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional

# Long enough for a model that checks is_cancelled() now and then to end the request itself.
CANCEL_GRACE_S = 2.0


class CancelGrace:
    def __init__(self, pending: Callable[[], dict], give_up: Callable[[int], None], grace_s: float = CANCEL_GRACE_S):
        """pending(): the instance's key -> request table; give_up(key): answer and forget it."""
        self._pending = pending
        self._give_up = give_up
        self.grace_s = grace_s
        self.since: dict[int, float] = {}  # cancelled pending key -> loop time of the cancel or its latest response
        self._timer: Optional[asyncio.TimerHandle] = None

    def cancelled(self, key: int) -> None:
        loop = asyncio.get_running_loop()
        self.since[key] = loop.time()
        if self._timer is None:
            self._timer = loop.call_later(self.grace_s, self._check)

    def answered(self, key: int, final: bool) -> None:
        """The model sent a response for a cancelled request: more grace, or none needed."""
        if final:
            self.since.pop(key, None)
        elif key in self.since:
            self.since[key] = asyncio.get_running_loop().time()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.since.clear()

    def _check(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        pending = self._pending()
        due = 0.0
        for key, since in list(self.since.items()):
            if key not in pending:
                del self.since[key]
                continue
            left = since + self.grace_s - now
            if left > 0:
                due = left if not due else min(due, left)
                continue
            del self.since[key]
            self._give_up(key)
        if due:
            self._timer = loop.call_later(due, self._check)
