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

    def __post_init__(self) -> None:
        if self.max_header_bytes < 1024:
            raise ValueError(f"the HTTP header size limit must be at least 1024 bytes, got {self.max_header_bytes}")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("HTTP header and body timeouts must be positive")


def _refusal(status: bytes, message: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % (len(message) + 12) + b'{"error":"' + message + b'"}')


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with Http1Limits; `limits` is set on a subclass (see protocol_with)."""

    limits: Http1Limits = Http1Limits()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._in_headers = True  # between a request's first byte (or the connection's start) and its headers' end
        self._header_bytes = 0
        self._timer: Optional[asyncio.TimerHandle] = None

    # ---- connection -----------------------------------------------------------

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s, self._header_timeout)

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        # Still inside the headers after this read: all of it counted against the limit.
        if self._in_headers and self._header_bytes > self.limits.max_header_bytes and self.parser is not None:
            self._refuse(b"431 Request Header Fields Too Large",
                         b"the request headers exceed %d bytes" % self.limits.max_header_bytes)

    # ---- parser callbacks -------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        if self._timer is None:  # a keep-alive connection's next request: its headers' clock starts now
            self._header_bytes = 0
            self._arm(self.limits.header_timeout_s, self._header_timeout)

    def on_headers_complete(self) -> None:
        size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
        self._in_headers = False
        self._header_bytes = 0
        if size > self.limits.max_header_bytes:
            self._refuse(b"431 Request Header Fields Too Large",
                         b"the request headers exceed %d bytes" % self.limits.max_header_bytes)
            raise httptools.HttpParserError("request headers too large")
        self._arm(self.limits.body_timeout_s, self._body_timeout)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._arm(self.limits.body_timeout_s, self._body_timeout)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    # ---- timers ------------------------------------------------------------------

    def _arm(self, delay: float, callback) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_timeout(self) -> None:
        self._timer = None
        if self._in_headers and self.transport is not None and not self.transport.is_closing():
            self._refuse(b"408 Request Timeout",
                         b"the request headers did not arrive within %g s" % self.limits.header_timeout_s)

    def _body_timeout(self) -> None:
        self._timer = None
        if self.transport is None or self.transport.is_closing():
            return
        if self.flow is not None and self.flow.read_paused:
            self._arm(self.limits.body_timeout_s, self._body_timeout)  # the app is not reading: not the client's fault
            return
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
