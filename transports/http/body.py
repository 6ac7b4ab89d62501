"""Reading a request body: every route that takes one (infer, generate, repository, shared
memory, logging, trace; SageMaker and Vertex AI JSON; the OpenAI API) reads it here, bounded by
--http-max-input-size. Each caller says how a body over the bound is refused.

The control routes (logging, trace settings, shared-memory registration, the repository API,
SageMaker's model load) decode their JSON whole, as Python objects, on the event loop: 64 MiB of
`[],[],...` took 5 s and 1.7 GB to decode (issue 31). Their bodies hold a few values (a model load's
files are base64 strings: one value each), so `check_json_values` first counts what could become
an object (separators, arrays, objects) and refuses a body with more than MAX_CONTROL_JSON_VALUES,
naming the limit; a large body is counted in pieces beside the loop, stopping at the limit.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional

from kernel.core.errors import ErrorCode, KernelError
from kernel.transports.http_limits import too_large_message


async def read_body(receive, limit: int,
                    check: Callable[[int, int], None] | None = None) -> Optional[bytes]:
    """The whole body of an ASGI request; None if the client disconnected.

    `check(size, limit)` raises when the bytes read so far pass `limit` (default: check_size,
    KServe's 400); it is called as the body arrives, so an oversized body is refused before it
    is all held."""
    if check is None:
        check = check_size
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    body = message.get("body", b"")
    if not message.get("more_body", False):
        check(len(body), limit)
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        check(size, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            if size > _INLINE_JOIN:
                # Joining bytes objects this large releases the GIL: on a thread, the copy (and its
                # page faults, ~25 ms for 30 MiB here) keeps no other client of the front waiting.
                return await asyncio.to_thread(b"".join, chunks)
            return b"".join(chunks)


# Bodies larger than this are joined from their pieces beside the loop.
_INLINE_JOIN = 1 << 20
# JSON values a control request may hold: far more than any real one (a model config sent as a
# string counts its own commas and brackets), few enough to decode in milliseconds.
MAX_CONTROL_JSON_VALUES = 65536
# Bodies up to this size are counted on the loop (well under a millisecond); larger ones on a thread.
_INLINE_COUNT = 64 * 1024
_COUNT_PIECE = 1 << 20


def _json_values(body, start: int, end: int) -> int:
    return body.count(b",", start, end) + body.count(b"[", start, end) + body.count(b"{", start, end)


def _count_values(body, limit: int) -> int:
    """The JSON values `body` may hold, counted piece by piece and no further than past `limit`
    (between two pieces the event loop takes the interpreter back)."""
    n = 0
    for start in range(0, len(body), _COUNT_PIECE):
        n += _json_values(body, start, start + _COUNT_PIECE)
        if n > limit:
            break
    return n


async def check_json_values(body: bytes, limit: int = MAX_CONTROL_JSON_VALUES) -> None:
    """KernelError (400) when a control request's JSON `body` may hold more than `limit` values."""
    if len(body) <= _INLINE_COUNT:
        n = _json_values(body, 0, len(body))
    else:
        n = await asyncio.to_thread(_count_values, body, limit)
    if n > limit:
        raise KernelError(ErrorCode.INVALID_ARG, f"failed to parse the request JSON buffer: it holds more than "
                                                 f"{limit} JSON values, the most a control request may hold")


def check_size(size: int, limit: int) -> None:
    if size > limit:
        raise KernelError(ErrorCode.INVALID_ARG, too_large_message(size, limit))
