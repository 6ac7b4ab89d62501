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
- body size: a Content-Length over the listener's `max_body` (--http-max-input-size) is refused
  when the headers arrive, with the words of an oversized body (too_large_message, which the
  app's own check while reading a body uses too); the connection then reads and drops what the
  client still sends for a moment (a lingering close) so that a client that sends its whole
  body before it reads still gets the 400.
- answers not yet read: a connection whose answer did not go at once (bytes left in its write
  buffer) is watched by the server's account of held answers (kernel.core.holding,
  --max-held-output-bytes, --client-stall-timeout-secs); the account cuts it (aborts the
  connection, which drops the answer's buffers) when it stalls or the total is over the bound.

And two courtesies of HTTP/1.1 that uvicorn's protocol lacks: garbage pipelined behind a valid
request is answered with its 400 only after that request's answer, and a client that shuts down
its sending side after its request (a half-close) still gets its answers.

Idle keep-alive connections are closed by uvicorn's own keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Callable, Optional

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kernel.core.holding import HeldBytes
from kernel.transports.reset import reset


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


def too_large_message(size: int, limit: int) -> str:
    """The words for a request body over --http-max-input-size (declared, or read so far)."""
    return (f"request body of {size} or more bytes exceeds the maximum allowed input size of {limit} bytes. "
            "Use --http-max-input-size to increase the limit.")


CHUNKS_MESSAGE = ("Chunked request body exceeds maximum of %d non-empty chunks. "
                  "Send fewer or larger HTTP chunks.")


def _refusal(status: bytes, message: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % (len(message) + 12) + b'{"error":"' + message + b'"}')


_HEADERS, _BODY, _DONE = 0, 1, 2  # where the current request is (DONE: read whole, or none begun)
# How long a connection refused for its declared body size goes on reading (and dropping) what the
# client still sends, so that the client reads the refusal rather than a reset.
LINGER_S = 2.0
# When a half-closed connection's TCP state is looked at: soon after the probe (a reset comes back
# within a round trip), then now and then while its answer is due.
PEER_CHECK_S = (0.05, 0.5, 1.0)
_TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux
_TCP_CLOSE = 7  # tcpi_state of a socket whose peer reset it


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with Http1Limits; `limits` is set on a subclass (see protocol_with).

    Cheap on the hot path: a request that arrives in one read arms no timer at all; a
    timer is armed only when a read leaves a request's headers or body unfinished, and
    it re-arms itself from the time of the last read rather than being reset on each one.
    """

    limits: Http1Limits = Http1Limits()
    # Set by protocol_with for the listeners that take request bodies (None: no check / no account).
    max_body: Optional[int] = None
    held: Optional[HeldBytes] = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _HEADERS
        self._header_bytes = 0
        self._started = 0.0  # when the current request's first byte came (or the connection opened)
        self._last_read = 0.0
        self._timer: Optional[asyncio.TimerHandle] = None
        self._chunked = False  # the request being read has Transfer-Encoding: chunked
        self._body_chunks = 0  # non-empty chunks of that request so far
        self._chunk_counted = False  # the chunk being read is counted (its data may come in pieces)
        # A refusal (garbage's 400, a body too large) due once the answers to the requests before it are out.
        self._deferred: Optional[Callable[[], None]] = None
        self._half_closed = False  # the client sent EOF after whole requests: answer them, then close
        self._peer_check: Optional[asyncio.TimerHandle] = None  # is a half-closed client still there?

    # ---- connection -----------------------------------------------------------

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._started = self._last_read = self.loop.time()
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._peer_check is not None:
            self._peer_check.cancel()
            self._peer_check = None
        if self.held is not None:
            self.held.unwatch(self)
        super().connection_lost(exc)

    def eof_received(self) -> Optional[bool]:
        """The client shut down its sending side. Requests it sent whole are still answered (True
        keeps the transport open for writing); with none due, or one cut short, close as before.

        A FIN is also what a client that went away sends: _probe_peer tells the two apart, so
        that a request whose client is gone is still cancelled."""
        cycle = self.cycle
        if (self._phase == _DONE and cycle is not None and not cycle.response_complete) or \
                (self._half_closed and self.pipeline):
            if not self._half_closed:
                self._half_closed = True
                self._probe_peer(cycle)
            return True
        return None

    def _probe_peer(self, cycle) -> None:
        """Send an interim 100 Continue (HTTP/1.1 clients must accept 1xx answers before the final
        one): a client that closed its socket answers it with a reset, which the socket's TCP state
        shows (CLOSE rather than CLOSE_WAIT); _check_peer then drops the connection, which cancels
        its request as any disconnect does. Only for half-closed connections, on Linux."""
        version = getattr(cycle, "http_version", None) or cycle.scope.get("http_version")
        if version == "1.0" or cycle.response_started or _TCP_INFO is None:
            return
        self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._peer_check = self.loop.call_later(PEER_CHECK_S[0], self._check_peer, 1)

    def _check_peer(self, attempt: int) -> None:
        self._peer_check = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        try:
            state = transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 8)[0]
        except (OSError, AttributeError):
            return
        if state == _TCP_CLOSE:
            transport.abort()
            return
        self._peer_check = self.loop.call_later(PEER_CHECK_S[min(attempt, len(PEER_CHECK_S) - 1)],
                                                self._check_peer, attempt + 1)

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
        self._body_chunks = 0
        chunked = False
        for name, value in self.headers:  # names are lower case already (uvicorn's on_header)
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"content-length" and self.max_body is not None and len(value) < 20 and value.isdigit() \
                    and int(value) > self.max_body:
                size = int(value)
                self._disarm()
                self._phase = _DONE  # no header or body timer for this connection any more
                self.parser = _Closed()
                self._when_due(lambda: self._refuse_body(size))
                raise httptools.HttpParserError("declared body too large")
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
        The app finds the connection in scope["kernel.transport"]: a stream corks its first write
        (kernel.transports.asgi.start_stream) and reads the connection's write buffer.
        """
        self.scope["kernel.transport"] = self.transport
        super().on_headers_complete()

    def on_chunk_header(self) -> None:
        self._chunk_counted = False

    def on_body(self, body: bytes) -> None:
        if self._chunked and body and not self._chunk_counted:
            # Chunks, not pieces: httptools hands over a chunk split across two reads in two pieces,
            # and a body of exactly the maximum count must pass, as tritonserver counts it.
            self._chunk_counted = True
            self._body_chunks += 1
            if self._body_chunks > self.limits.max_body_chunks:
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
        if self.transport is None or self.transport.is_closing() or type(self.parser) is _Closed:
            return  # not after a refusal of ours (431, 408, a body too large)
        self.parser = _Closed()
        self._when_due(lambda: HttpToolsProtocol.send_400_response(self, msg))

    def _when_due(self, refuse: Callable[[], None]) -> None:
        """Refuse now, or once the requests before this one are answered (their answers go first)."""
        cycle = self.cycle
        if self.pipeline or (cycle is not None and not cycle.response_complete):
            self._deferred = refuse
            self.flow.pause_reading()
        else:
            refuse()

    def on_response_complete(self) -> None:
        held = self.held
        if held is not None and self.transport.get_write_buffer_size():
            held.watch(self)  # the answer did not go at once: count it until it does
        super().on_response_complete()
        if self._deferred is None and not self._half_closed:
            return
        cycle = self.cycle
        if self.pipeline or (cycle is not None and not cycle.response_complete) or self.transport.is_closing():
            return  # a request pipelined behind this one is due first
        if self._deferred is not None:
            refuse, self._deferred = self._deferred, None
            refuse()
        else:
            self.transport.close()

    # ---- answers the client does not read (kernel.core.holding's Holder) ------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.held is not None:
            self.held.watch(self)

    def resume_writing(self) -> None:
        super().resume_writing()
        held = self.held
        if held is not None:
            # The client reads: count it again from what is left (under the transport's low-water
            # mark), so the total does not wait for the next sweep; a rest it then stalls on is
            # still cut.
            held.unwatch(self)
            held.watch(self)

    def held_bytes(self) -> int:
        transport = self.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def cut(self, reason: str) -> None:
        """Drop the client: abort() discards the write buffer and with it the answer's buffers; a
        reset, so the kernel's send buffer goes too and the client sees the cut."""
        if self.transport is not None:
            reset(self.transport)

    def transferring(self) -> bool:
        """A body is being read, or an answer is still being written (the drain at shutdown waits)."""
        transport = self.transport
        if transport is None:
            return False
        if transport.get_write_buffer_size():
            return True
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and not transport.is_closing()

    def _refuse(self, status: bytes, message: bytes) -> None:
        self._disarm()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_refusal(status, message))
            self.transport.close()
        self.parser = _Closed()

    def _refuse_body(self, size: int) -> None:
        """400 for a declared body over max_body, before any of it is read; then a lingering close:
        the client's FIN is awaited (eof_received closes) and what it still sends is dropped, for
        at most LINGER_S."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(_refusal(b"400 Bad Request", too_large_message(size, self.max_body).encode()))
        if self.flow is not None:
            self.flow.resume_reading()
        try:
            transport.write_eof()
        except (NotImplementedError, OSError, RuntimeError):
            transport.close()
            return
        self.loop.call_later(LINGER_S, transport.close)


class _Closed:
    """Stands in for the parser once a connection was refused: whatever else arrives is ignored."""

    def feed_data(self, data: bytes) -> None:
        pass

    def should_upgrade(self) -> bool:
        return False


def protocol_with(limits: Http1Limits, max_body: Optional[int] = None, held: Optional[HeldBytes] = None) -> type:
    """A LimitedHttpToolsProtocol class for `limits` (uvicorn takes a class, and builds one per connection);
    max_body: refuse a larger declared Content-Length at the headers; held: the account of held answers."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,),
                {"limits": limits, "max_body": max_body, "held": held})
