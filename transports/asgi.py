"""ASGI plumbing shared by every transport: lifespan, plain responses, the uvicorn listener.

Each transport is a raw ASGI app served by uvicorn (httptools) inside the
front process's event loop; this module is the one place that knows how.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from typing import Callable, Optional

import msgspec

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.holding import HeldBytes
from kernel.transports import listen
from kernel.transports.http_limits import Http1Limits, protocol_with

# KernelError code -> HTTP status, as tritonserver answers; every other code is a client error (400).
_STATUS = {
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
}


def status_for(error: KernelError) -> int:
    """The HTTP status for a KernelError (shared by the KServe, SageMaker and Vertex AI routes)."""
    return _STATUS.get(error.code, 400)


async def lifespan(receive, send) -> None:
    """Answer an ASGI lifespan conversation (servers that send one: hypercorn)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def send_response(send, status: int, headers, body: bytes) -> None:
    # An explicit content-length keeps the server from chunking the body.
    headers = [*headers, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def start_stream(send, transport, status: int, headers, body: bytes, more_body: bool) -> None:
    """A streamed answer's status line, headers and first bytes, in one TCP segment.

    uvicorn writes the headers as soon as it is given them, and the first body in a write of its
    own: the first write wakes the client for headers alone, and on a busy machine the second
    waits until the client has run and blocked again (~0.3-0.5 ms of the time to first token at
    concurrency 1 here; tritonserver sends both at once). TCP_CORK holds the first write until the
    second is in; it costs two setsockopt calls per stream, none per later event. `transport` is
    the connection (scope["kernel.transport"], set by every HTTP/1.1 listener); None: no cork.
    """
    sock = transport.get_extra_info("socket") if transport is not None else None
    corked = False
    if sock is not None and _TCP_CORK is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 1)
            corked = True
        except OSError:
            pass
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": more_body})
    finally:
        if corked:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 0)
            except OSError:
                pass


_TCP_CORK = getattr(socket, "TCP_CORK", None)  # Linux


class UvicornListener:
    """One uvicorn server (httptools) for `app`, running in the current event loop."""

    def __init__(self, app, host: str, port: int, what: str, limits: Optional[Http1Limits] = None,
                 protocol: Optional[Callable[..., asyncio.BaseProtocol]] = None, max_body: Optional[int] = None,
                 held: Optional[HeldBytes] = None):
        """protocol: what uvicorn builds per connection (a class, or a factory); by default
        protocol_with(limits, max_body, held). The KServe front passes its fast path's
        (kernel.transports.http.fast)."""
        self.app = app
        self.host = host
        self.port = port
        self.what = what  # for the bind error: "HTTP", "metrics", ...
        # Header size and header/body timeouts for every connection (kernel.transports.http_limits).
        self.limits = limits or Http1Limits()
        self.protocol = protocol
        self.max_body = max_body
        self.held = held
        self._connections: set = set()  # uvicorn's, kept past stop() for transfers() and close()
        self._server = None
        self._task: asyncio.Task | None = None
        self._closing: asyncio.Task | None = None

    async def start(self) -> None:
        import uvicorn

        config = uvicorn.Config(
            self.app, host=self.host, port=self.port,
            http=self.protocol or protocol_with(self.limits, self.max_body, self.held), loop="none",
            lifespan="off", access_log=False, log_level="warning", timeout_graceful_shutdown=None,
        )

        class _Server(uvicorn.Server):
            # The front process owns signal handling; uvicorn must not install its own.
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        # The socket is bound here, not by uvicorn: a taken port is then an OSError with its errno
        # for the caller to report, instead of a line uvicorn logs itself before exiting.
        sock = listen.bind(self.host, self.port, self.what)
        self._server = _Server(config)
        self._connections = self._server.server_state.connections
        config.load()
        self._server.lifespan = config.lifespan_class(config)
        try:
            await self._server.startup(sockets=[sock])
        except SystemExit:
            # uvicorn exits the process when it cannot bind; the caller decides instead.
            self._server = None
            raise OSError(f"could not listen on {self.host}:{self.port} for {self.what}") from None
        if self._server.should_exit:
            raise OSError(f"could not listen on {self.host}:{self.port} for {self.what}")
        self._task = asyncio.ensure_future(self._server.main_loop())

    async def stop(self, grace_s: Optional[float] = None) -> None:
        """Stop listening now; with `grace_s`, return at once and give open connections that long.

        Why not wait: uvicorn waits for every open connection to close, and a client holding a
        half-sent body (or a request the model never answers) kept a stopping server up far past
        --exit-timeout-secs. With `grace_s` the server's own drain (bounded by the exit timeout)
        runs meanwhile, and whatever connection is still open when the grace ends is cut.
        """
        if self._server is None:
            return
        server, self._server = self._server, None
        server.should_exit = True
        if self._task is not None:
            await self._task
        if grace_s is None:
            await server.shutdown()
            return
        server.config.timeout_graceful_shutdown = grace_s
        self._closing = asyncio.ensure_future(self._shutdown_within(server))
        # Usually every connection is idle and the shutdown is over in ~0.1 s: wait for that much, so
        # nothing is left running when the caller's loop ends; only a connection still busy after it
        # goes on in the background, for the rest of the grace.
        await asyncio.wait([self._closing], timeout=min(grace_s, 1.0))

    @staticmethod
    async def _shutdown_within(server) -> None:
        try:
            await server.shutdown()
        finally:
            for connection in list(server.server_state.connections):
                if connection.transport is not None:
                    connection.transport.abort()

    def transfers(self) -> int:
        """Connections reading a request body or writing an answer (http_limits' transferring())."""
        count = 0
        for connection in self._connections:
            transferring = getattr(connection, "transferring", None)  # a WebSocket has none
            if transferring is not None and transferring():
                count += 1
        return count

    async def close(self) -> None:
        """Cut every connection still open (the exit timeout is spent) and end the shutdown task."""
        for connection in list(self._connections):
            if connection.transport is not None:
                connection.transport.abort()
        closing, self._closing = self._closing, None
        if closing is not None and not closing.done():
            closing.cancel()
            await asyncio.gather(closing, return_exceptions=True)


JSON_HEADERS = [(b"content-type", b"application/json")]
_json = msgspec.json.Encoder()


async def send_json(send, status: int, doc) -> None:
    await send_response(send, status, JSON_HEADERS, _json.encode(doc))


async def send_error(send, status: int, message: str) -> None:
    """KServe's error body: {"error": "<message>"}."""
    await send_json(send, status, {"error": message})


async def send_status(send, status: int) -> None:
    await send_response(send, status, [], b"")
