"""Reading a request body: every route that takes one (infer, generate, repository, shared
memory, logging, trace) reads it here, bounded by --http-max-input-size."""

from __future__ import annotations

from typing import Optional

from kernel.core.errors import ErrorCode, KernelError
from kernel.transports.http_limits import too_large_message


async def read_body(receive, limit: int) -> Optional[bytes]:
    """The whole body of an ASGI request, refused past `limit` bytes; None if the client disconnected."""
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    body = message.get("body", b"")
    if not message.get("more_body", False):
        check_size(len(body), limit)
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        check_size(size, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def check_size(size: int, limit: int) -> None:
    if size > limit:
        raise KernelError(ErrorCode.INVALID_ARG, too_large_message(size, limit))
