"""Limits on what one HTTP/1.1 client can make the server hold: header size, and time to send headers and body.

Why: uvicorn's httptools protocol bounds none of these. A 200 MB header value was
buffered whole (+400 MB, and other clients stalled while it was parsed), and a
connection that sends half its headers, or nothing, or half a body, was held
forever (slowloris). Every listener built on kernel.transports.asgi.UvicornListener
(KServe HTTP, SageMaker, Vertex AI, metrics) speaks through LimitedHttpToolsProtocol.

- header size: the request line and headers of one request may take at most
  `max_header_bytes`; past that the client gets 431 and the connection closes.
- header time: from the connection's start (or a request's first byte) to the end of
  its headers, at most `header_timeout_s`; then 408 and close.
- body time: while a request body is still arriving, at most `body_timeout_s` between
  two reads (not counted while the app has reading paused); then 408 and close, which
  the app sees as the client going away.
- body chunks: a chunked body may arrive in at most `max_body_chunks` non-empty chunks
  (65536, as tritonserver); past that 400 with tritonserver's words, and close.

Idle keep-alive connections are closed by uvicorn's own keep-alive timeout.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class Http1Limits:
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    # Non-empty chunks one chunked request body may arrive in (tritonserver's cap, and its words in
    # CHUNKS_MESSAGE): a body of millions of one-byte chunks costs far more than its size.
    max_body_chunks: int = 65536

    def __post_init__(self) -> None:
        if self.max_header_bytes < 1024:
            raise ValueError(f"the HTTP header size limit must be at least 1024 bytes, got {self.max_header_bytes}")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("HTTP header and body timeouts must be positive")


CHUNKS_MESSAGE = ("Chunked request body exceeds maximum of %d non-empty chunks. "
                  "Send fewer or larger HTTP chunks.")


def _refusal(status: bytes, message: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % (len(message) + 12) + b'{"error":"' + message + b'"}')


_HEADERS, _BODY, _DONE = 0, 1, 2  # where the current request is (DONE: read whole, or none begun)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with Http1Limits; `limits` is set on a subclass (see protocol_with).

    Cheap on the hot path: a request that arrives in one read arms no timer at all; a
    timer is armed only when a read leaves a request's headers or body unfinished, and
    it re-arms itself from the time of the last read rather than being reset on each one.
    """

    limits: Http1Limits = Http1Limits()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _HEADERS
        self._header_bytes = 0
        self._started = 0.0  # when the current request's first byte came (or the connection opened)
        self._last_read = 0.0
        self._timer: Optional[asyncio.TimerHandle] = None
        self._chunked = False  # the request being read has Transfer-Encoding: chunked
        self._body_pieces = 0  # non-empty body pieces of that request so far (one or more per chunk)

    # ---- connection -----------------------------------------------------------

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._started = self._last_read = self.loop.time()
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        if self._phase == _HEADERS:
            self._header_bytes += len(data)
        super().data_received(data)
        phase = self._phase
        if phase == _DONE or self.parser is None:
            return
        # Still inside the headers after this read: all of it counted against the limit.
        if phase == _HEADERS and self._header_bytes > self.limits.max_header_bytes:
            self._refuse(b"431 Request Header Fields Too Large",
                         b"the request headers exceed %d bytes" % self.limits.max_header_bytes)
        elif self._timer is None:
            self._arm(self.limits.header_timeout_s if phase == _HEADERS else self.limits.body_timeout_s)

    def read_past_parser(self) -> None:
        """Body bytes were read into a buffer without going through data_received (the fast
        path's direct body reads): the body's clock restarts as it does for any read."""
        self._last_read = self.loop.time()

    # ---- parser callbacks -------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase == _DONE:  # a keep-alive connection's next request: its headers' clock starts now
            self._phase = _HEADERS
            self._started = self._last_read
            self._header_bytes = 0

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        # A timer still set for the headers (the connection's first request) would let a body pause
        # for the header timeout, not the body's: the read's end re-arms it for the body if needed.
        self._disarm()
        self._body_pieces = 0
        chunked = False
        for name, value in self.headers:  # names are lower case already (uvicorn's on_header)
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        self._chunked = chunked
        # The reads so far bound the headers' size: count them exactly only when those could exceed the limit.
        if self._header_bytes > self.limits.max_header_bytes:
            size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
            if size > self.limits.max_header_bytes:
                self._refuse(b"431 Request Header Fields Too Large",
                             b"the request headers exceed %d bytes" % self.limits.max_header_bytes)
                raise httptools.HttpParserError("request headers too large")
        self.headers_complete()

    def headers_complete(self) -> None:
        """A request's headers passed the limits: start it (uvicorn's ASGI cycle).

        A hook rather than code in on_headers_complete so that a subclass (the KServe HTTP
        fast path, kernel.transports.http.fast) can take some requests itself, after the checks.
        """
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._chunked and body:
            # httptools hands over each chunk's data (a chunk split across two reads comes in two pieces).
            self._body_pieces += 1
            if self._body_pieces > self.limits.max_body_chunks:
                self._refuse(b"400 Bad Request", (CHUNKS_MESSAGE % self.limits.max_body_chunks).encode())
                raise httptools.HttpParserError("too many body chunks")
        self.body_received(body)

    def body_received(self, body: bytes) -> None:
        """A piece of the body passed the limits: hand it on (a hook, as headers_complete)."""
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._phase = _DONE
        self.message_complete()

    def message_complete(self) -> None:
        """The request was read whole (a hook, as headers_complete)."""
        super().on_message_complete()

    # ---- the timer ---------------------------------------------------------------

    def _arm(self, delay: float) -> None:
        self._timer = self.loop.call_later(delay, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport is None or self.transport.is_closing():
            return
        now = self.loop.time()
        if self._phase == _HEADERS:
            due = self._started + self.limits.header_timeout_s
            if now < due:
                self._arm(due - now)
                return
            self._refuse(b"408 Request Timeout",
                         b"the request headers did not arrive within %g s" % self.limits.header_timeout_s)
        elif self._phase == _BODY:
            due = self._last_read + self.limits.body_timeout_s
            if self.flow is not None and self.flow.read_paused:
                self._arm(self.limits.body_timeout_s)  # the app is not reading: not the client's fault
            elif now < due:
                self._arm(due - now)
            else:
                self._body_expired()

    def _body_expired(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            # The app is still reading the body: no response of its own has begun.
            self._refuse(b"408 Request Timeout",
                         b"the request body paused for more than %g s" % self.limits.body_timeout_s)
            return
        # The app's receive() now reports a disconnect; whatever it was reading is dropped.
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        if self.transport is not None and not self.transport.is_closing():  # not after a 431 or 408 of ours
            super().send_400_response(msg)

    def _refuse(self, status: bytes, message: bytes) -> None:
        self._disarm()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_refusal(status, message))
            self.transport.close()
        self.parser = _Closed()


class _Closed:
    """Stands in for the parser once a connection was refused: whatever else arrives is ignored."""

    def feed_data(self, data: bytes) -> None:
        pass

    def should_upgrade(self) -> bool:
        return False


def protocol_with(limits: Http1Limits) -> type:
    """A LimitedHttpToolsProtocol class for `limits` (uvicorn takes a class, and builds one per connection)."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})
