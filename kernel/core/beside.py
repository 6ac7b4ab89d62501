"""Where the core copies client-sized buffers beside the event loop: one small pool of threads.

Used for the bytes of client shared-memory regions (kernel.core.admission, kernel.core.output_writes):
pread and pwrite let go of the GIL, so the loop keeps serving every other client meanwhile.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

_pool: Optional[ThreadPoolExecutor] = None


def run_beside(fn: Callable, *args) -> asyncio.Future:
    """fn(*args) on one of the pool's threads; a future of the running loop for its result."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="kernel-beside")
    return asyncio.get_running_loop().run_in_executor(_pool, fn, *args)
