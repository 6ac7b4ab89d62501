"""Makes a request that waits too long for its response visible: one warning per request.

Why: a hung execute(), or a non-decoupled execute() that returns None without
answering through its response senders, leaves requests unanswered. tritonserver
2.51 does the same and logs nothing (checked with the real server), so the
behaviour stays; but here the log says which request, on which instance, and
for how long, and the client can still cancel it (a disconnect reaches the
model as request.is_cancelled()).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional

log = logging.getLogger("kernel.python")


class AgeWatch:
    """Checks the instance's pending requests while there are any; warns once for each older than threshold_s."""

    def __init__(self, instance_name: str, threshold_s: float, pending: Callable[[], dict]):
        self.instance_name = instance_name
        self.threshold_ns = int(threshold_s * 1e9)
        self.period_s = max(0.25, threshold_s / 4)
        self._pending = pending  # key -> InferRequest, the instance's current table
        self._warned: set[int] = set()
        self._progress: dict[int, int] = {}  # key -> when its latest non-final response came (a stream moving on)
        self._timer: Optional[asyncio.TimerHandle] = None

    def watch(self) -> None:
        """Called when requests were sent: start checking if not already."""
        if self._timer is None and self.threshold_ns > 0:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no event loop (a unit test driving an instance): nothing can answer anyway
                return
            self._timer = loop.call_later(self.period_s, self._check)

    def progressed(self, key: int) -> None:
        """A request sent a non-final response: it is not stuck, whatever its age (a long decoupled stream)."""
        self._progress[key] = time.monotonic_ns()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._warned.clear()
        self._progress.clear()

    def _check(self) -> None:
        self._timer = None
        pending = self._pending()
        now = time.monotonic_ns()
        progress = self._progress
        for key, request in pending.items():
            arrival = max(request.arrival_ns, progress.get(key, 0)) if progress else request.arrival_ns
            if arrival and now - arrival > self.threshold_ns and key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "request '%s' on model instance '%s' has waited %.0f s for a response: execute() may be "
                    "hung, or returned without answering it (a non-decoupled execute() that returns None must "
                    "answer through the request's response sender). It stays pending until the model answers or "
                    "the client cancels it.",
                    request.id or "<id_unknown>", self.instance_name, (now - arrival) / 1e9,
                )
        self._warned.intersection_update(pending.keys())
        for key in [k for k in progress if k not in pending]:
            del progress[key]
        if pending:
            self.watch()
