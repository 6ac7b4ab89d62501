"""Large buffers go back to the system once freed, in the processes that serve clients.

glibc's malloc gives an allocation above its mmap threshold a mapping of its own, unmapped at
free(), but it raises that threshold to the size of any such block freed (up to 32 MiB): after
the first 8 MiB answer is freed, the next ones come from the heap, and freed heap memory mostly
stays with the process. A server that holds client-sized answers for slow readers (up to
--max-held-output-bytes) then keeps its peak after every one is cut or delivered. Fixing the
threshold at 1 MiB keeps large buffers mapped and returned: measured with
tests/transports/openai/test_openai_bounds.py's non-reading clients, the front's anonymous memory
stayed 66-69 MiB above its start after the cut in about 1 run in 4 without it, under 64 MiB in
every run with it. Each buffer of a MiB or more pays a mapping (tens of microseconds, beside a
copy of that size). Nothing is done where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h
THRESHOLD = 1 << 20


def return_large_buffers(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (see the module docstring); False where that cannot be done."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
