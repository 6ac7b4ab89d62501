"""Reading a request body: every route that takes one (infer, generate, repository, shared
memory, logging, trace; SageMaker and Vertex AI JSON; the OpenAI API) reads it here, bounded by
--http-max-input-size. Each caller says how a body over the bound is refused."""

from __future__ import annotations

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
            return b"".join(chunks)


def check_size(size: int, limit: int) -> None:
    if size > limit:
        raise KernelError(ErrorCode.INVALID_ARG, too_large_message(size, limit))
