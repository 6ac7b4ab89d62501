"""Progress lines for long model loads.

Large models take minutes in initialize(); Kernel waits for them without a limit, as Triton does
(`stub-timeout-seconds` bounds only the worker's start, not the model's initialize). So that a
long load does not look like a hang, the loader logs "still loading '<model>' version <v> (N s)"
after FIRST_S seconds and every EVERY_S seconds after that, until the version is loaded or has
failed. A timer on the event loop, nothing per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from kernel.observe.log import model_event

log = logging.getLogger("kernel.core.server")

FIRST_S = 5.0
EVERY_S = 10.0


@contextlib.asynccontextmanager
async def load_progress(name: str, version: int):
    """Log progress while the body (a model version's load) runs."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    handle = None

    def tick() -> None:
        nonlocal handle
        log.info("still loading '%s' version %d (%d s)", name, version, round(time.monotonic() - started),
                 extra=model_event(name, "LOADING", version))
        handle = loop.call_later(EVERY_S, tick)

    handle = loop.call_later(FIRST_S, tick)
    try:
        yield
    finally:
        handle.cancel()
