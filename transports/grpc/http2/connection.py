"""The server side of one HTTP/2 connection (RFC 9113), as an asyncio Protocol.

It implements the connection preface, SETTINGS (and their acknowledgement),
HEADERS + CONTINUATION with HPACK decoding (the `hpack` package, behind a cache
of decoded header blocks), DATA with padding, flow control in both directions,
PING, RST_STREAM, GOAWAY and WINDOW_UPDATE, and server keepalive pings;
PRIORITY and unknown frame types are ignored and server push is never used.

It also enforces what a production server bounds (limits.py): concurrent
streams, header list size, flow-control windows, queued output, PING / SETTINGS /
RST_STREAM floods, and handshake, idle and age timeouts. What a client that does not
read makes the server hold is shown to the server's account of held answers
(`server.held_output`, kernel.core.holding): each blocked stream (output.py), and the
connection itself while its transport's buffer is over the high-water mark (the
client is not reading its socket); a holder with no progress for the stall timeout
is cut.

It knows nothing of what the streams carry: a subclass receives each request's
headers, body chunks and end of input through the `on_*` hooks and answers with
`send`, `send_whole` and `send_headers`. Output produced in one loop iteration
leaves in one write.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from typing import Optional

from kernel.transports.grpc.http2.frames import (
    CONTINUATION, DATA, DEFAULT_MAX_FRAME, DEFAULT_WINDOW, ENHANCE_YOUR_CALM, FLAG_ACK, FLAG_END_HEADERS,
    FLAG_END_STREAM, FLAG_PADDED, FLAG_PRIORITY, FLOW_CONTROL_ERROR, FRAME_HEADER, FRAME_SIZE_ERROR, GOAWAY,
    GOAWAY_PAYLOAD, HEADERS, MAX_WINDOW, NO_ERROR, PING, PREFACE, PROTOCOL_ERROR, PUSH_PROMISE, REFUSED_STREAM,
    RST_STREAM, SETTING, SETTINGS, SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE, STREAM_CLOSED, U32, WINDOW_UPDATE, ProtocolError, frame,
)
from kernel.transports.grpc.http2.data_input import WINDOW_UPDATE_DIVISOR, DataInputMixin
from kernel.transports.grpc.http2.headers import HeaderError, HeaderReader
from kernel.transports.grpc.http2.limits import Http2Limits, PingPolicy, RateLimit
from kernel.transports.grpc.http2.output import OutputMixin
from kernel.transports.grpc.http2.timers import ConnectionClock
from kernel.transports.reset import reset

log = logging.getLogger("kernel.grpc")

# Stream ids remembered after their streams close, to tell HEADERS on a closed stream
# (STREAM_CLOSED) from a new stream reusing a lower id (PROTOCOL_ERROR).
RECENT_STREAMS = 1024
# Seconds a closed connection may take to hand its last bytes to a client before it is dropped.
LINGER_AFTER_ERROR = 1.0
LINGER = 10.0


class Stream:
    """The HTTP/2 state of one stream; a subclass adds what the application keeps per request."""

    __slots__ = (
        "id", "recv_unacked", "recv_window", "send_window", "pending", "pending_bytes", "trailers", "remote_closed", "closed",
        "headers_sent", "window_held",
    )

    def __init__(self, stream_id: int, send_window: int, recv_window: int):
        self.id = stream_id
        self.recv_unacked = 0
        self.recv_window = recv_window  # what the client may still send before a WINDOW_UPDATE
        self.send_window = send_window
        self.pending: collections.deque = collections.deque()  # DATA payloads waiting for window
        self.pending_bytes = 0  # their total size
        self.trailers: Optional[bytes] = None  # set once the answer is complete: sent after pending
        self.remote_closed = False
        self.closed = False
        self.headers_sent = False
        self.window_held = False  # the application takes no more of its body for now: no WINDOW_UPDATE


class Http2Connection(DataInputMixin, OutputMixin, asyncio.BufferedProtocol):
    """Server side of one HTTP/2 connection; the subclass supplies the `on_*` hooks."""

    stream_type = Stream

    def __init__(self, server):
        self.server = server  # has .loop, .connections, .limits and the keepalive settings
        self.loop = server.loop
        self.limits: Http2Limits = server.limits
        self.transport = None
        self.streams: dict[int, Stream] = {}
        self.partial: Optional[bytearray] = None  # an incomplete frame (or preface)
        self.partial_need = 0  # bytes partial must reach before it can be parsed
        self.preface_seen = False
        self.settings_seen = False
        self.last_stream_id = 0
        self.recent_ids: collections.deque = collections.deque(maxlen=RECENT_STREAMS)
        self.headers = HeaderReader(self.limits)
        # flow control
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self.recv_unacked = 0
        self.recv_window = self.limits.initial_window  # after the WINDOW_UPDATE sent with SETTINGS
        self.reading_paused = False
        self.granting: list = []  # streams owed a WINDOW_UPDATE at the end of this read
        # A DATA frame whose payload is still arriving: its payload goes to the stream as it
        # comes (views of each read), never gathered into `partial` first.
        self.data_left = 0  # payload bytes of it still to come
        self.data_flags = 0
        self.data_stream: Optional[Stream] = None  # None: the payload is dropped (stream gone)
        self.recv_view = server.recv_buffer  # where reads land unless they go straight to a message
        self.direct = False  # the last get_buffer() handed out a stream's message buffer
        self.header_next = False  # read only a frame header next (see get_buffer)
        # flood policing
        self.pings = PingPolicy(self.limits)
        self.sent_data = False  # DATA or HEADERS went out since the last ping arrived
        self.control_queued = 0  # PING/SETTINGS acknowledgements written since the client last read
        self.settings_rate = RateLimit(self.limits.settings_burst, self.limits.settings_rate)
        self.reset_rate = RateLimit(self.limits.reset_burst, self.limits.reset_rate)
        self.idle_frames = RateLimit(self.limits.idle_frames_burst, self.limits.idle_frames_rate)
        self.idle_since = 0.0  # when the last stream closed
        self.blocked: dict[int, Stream] = {}  # streams with output waiting for window
        # The server's account of held answers (kernel.core.holding.HeldBytes; None: not kept),
        # and the holders it watches for this connection's blocked streams.
        self.held_output = getattr(server, "held_output", None)
        self.stalled: dict = {}
        self.linger = LINGER  # how long a closing connection may take to hand over its last bytes
        # output coalescing: frames produced in one loop iteration leave in one write
        self.out: list = []
        self.out_large = False  # out holds large DATA views: written with writelines, not joined
        self.flush_handle = None
        self.paused = False
        self.closing = False
        self.goaway_sent = False
        self.failed = False
        self.pings_without_data = 0  # keepalive pings sent since DATA or HEADERS last went out
        self.clock = ConnectionClock(self)

    # ---- hooks for the application layer ----------------------------------------

    def on_request(self, s: Stream, headers: list, end_stream: bool) -> None:
        """A new stream's request headers (raw (name, value) byte pairs)."""
        raise NotImplementedError

    def on_body(self, s: Stream, chunk: bytes) -> None:
        """A chunk of a stream's request body."""
        raise NotImplementedError

    def on_end_stream(self, s: Stream) -> None:
        """The client has sent all of a stream's request (called once, after `remote_closed` is set)."""
        raise NotImplementedError

    def on_closed(self, s: Stream) -> None:
        """The stream is over or abandoned: stop whatever work it started."""

    def on_input_done(self) -> None:
        """Everything in one read has been handled (frames after a request may have reset it)."""

    def body_target(self, s: Stream, limit: int):
        """Where the next (at most `limit`) bytes of a stream's body should be read to: a writable
        memoryview (then `body_filled` follows instead of `on_body`), or None."""
        return None

    def body_filled(self, s: Stream, n: int) -> None:
        """n bytes of the stream's body were read into the view `body_target` gave."""
        raise NotImplementedError

    def on_oversized_headers(self, s: Stream, size: int) -> None:
        """A request whose header list is over max_header_list_size: refuse the stream."""
        self.close_stream(s)
        self.write(frame(RST_STREAM, 0, s.id, U32.pack(REFUSED_STREAM)))

    def abort(self) -> None:
        """Stop every stream's work and close (the application may answer them first)."""
        for s in list(self.streams.values()):
            self.abandon(s)
        self.close_soon()

    # ---- connection lifecycle -------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):
                pass
        self.server.connections.add(self)
        limits = self.limits
        settings = b"".join(
            SETTING.pack(k, v)
            for k, v in (
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
                (SETTINGS_INITIAL_WINDOW_SIZE, limits.initial_window),
                (SETTINGS_MAX_FRAME_SIZE, limits.max_frame_size),
                (SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
            )
        )
        self.write(frame(SETTINGS, 0, 0, settings))
        if limits.initial_window > DEFAULT_WINDOW:
            self.write(frame(WINDOW_UPDATE, 0, 0, U32.pack(limits.initial_window - DEFAULT_WINDOW)))
        self.idle_since = self.loop.time()
        self.clock.start()

    def connection_lost(self, exc) -> None:
        self.closing = True
        self.server.connections.discard(self)
        self.clock.stop()
        if self.flush_handle is not None:
            self.flush_handle.cancel()
        streams, self.streams = self.streams, {}
        for s in streams.values():
            self.abandon(s)
        self.blocked.clear()
        if self.held_output is not None:
            self.held_output.unwatch(self)

    def pause_writing(self) -> None:
        self.paused = True
        if self.held_output is not None:
            # Watched until its buffer is empty (the account's sweep drops it then), not just
            # until it is below the low-water mark: a large answer pauses and resumes the
            # transport many times, and one watch covers all of them.
            self.held_output.watch(self)

    def resume_writing(self) -> None:
        self.paused = False
        self.control_queued = 0  # the client reads what it is sent
        if self.reading_paused:
            self.reading_paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
        for s in list(self.blocked.values()):
            self._pump(s)

    # ---- input ----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.failed:
            return  # a connection error was answered with GOAWAY: nothing more is read
        pos = 0
        partial = self.partial
        if self.data_left:
            pos = self._data_payload(data, 0, len(data))
            buf = data
        elif partial is not None:
            partial += data
            if len(partial) < self.partial_need:
                return
            buf = bytes(partial)
            self.partial = None
        else:
            buf = data
        end = len(buf)
        if not self.preface_seen:
            if end < 24:
                if not PREFACE.startswith(buf):
                    self.close_now()
                    return
                self.partial, self.partial_need = bytearray(buf), 24
                return
            if buf[:24] != PREFACE:
                self.close_now()
                return
            self.preface_seen = True
            pos = 24
        unpack = FRAME_HEADER.unpack_from
        try:
            while end - pos >= 9:
                hi, lo, kind, flags, stream_id = unpack(buf, pos)
                length = (hi << 8) | lo
                start = pos + 9
                stream_id &= 0x7FFFFFFF
                if self.headers.block is not None and kind != CONTINUATION:
                    raise ProtocolError(PROTOCOL_ERROR, "expected a CONTINUATION frame")
                if not self.settings_seen and kind != SETTINGS:
                    raise ProtocolError(PROTOCOL_ERROR, "the connection preface must start with SETTINGS")
                if end - start < length:
                    if length > self.limits.max_frame_size:
                        raise ProtocolError(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                    if kind == DATA and not flags & FLAG_PADDED:
                        # Its payload is handed on as it arrives (what a large message is made of).
                        self._data_start(stream_id, flags, length)
                        pos = self._data_payload(buf, start, end)
                    break
                pos = start + length
                if kind == DATA:
                    self._on_data(stream_id, flags, buf, start, pos)
                elif kind == HEADERS:
                    self._on_headers(stream_id, flags, buf[start:pos])
                elif kind == CONTINUATION:
                    self._on_continuation(stream_id, flags, buf[start:pos])
                elif kind == SETTINGS:
                    self._on_settings(stream_id, flags, buf[start:pos])
                elif kind == WINDOW_UPDATE:
                    self._on_window_update(stream_id, buf[start:pos])
                elif kind == PING:
                    self._on_ping(flags, buf[start:pos])
                elif kind == RST_STREAM:
                    self._on_rst_stream(stream_id, pos - start)
                elif kind == GOAWAY:
                    self._on_goaway()
                elif kind == PUSH_PROMISE:
                    raise ProtocolError(PROTOCOL_ERROR, "clients must not push")
                elif not self.idle_frames.allow():
                    # PRIORITY and unknown frame types are ignored, but not in any number
                    raise ProtocolError(ENHANCE_YOUR_CALM, "flood of frames that do nothing", b"flood")
        except (ProtocolError, HeaderError) as exc:
            log.debug("HTTP/2 protocol error from a client: %s", exc)
            self.failed = True
            self.goaway(exc.code, getattr(exc, "debug", b"") or str(exc).encode("ascii", "replace")[:256])
            self.close_soon(LINGER_AFTER_ERROR)
            return
        if pos < end:
            rest = bytearray(buf[pos:]) if pos else bytearray(buf)
            self.partial = rest
            if len(rest) >= 9:
                hi, lo = rest[0] << 8 | rest[1], rest[2]
                self.partial_need = 9 + ((hi << 8) | lo)
            else:
                self.partial_need = 9
        self._read_done()

    def _read_done(self) -> None:
        """What follows each read: start the calls it completed, grant window, police output."""
        self.on_input_done()
        if self.granting:
            self._grant_streams()
        if self.recv_unacked >= self.limits.initial_window // WINDOW_UPDATE_DIVISOR:
            self.write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self.recv_unacked)))
            self.recv_window += self.recv_unacked
            self.recv_unacked = 0
        if self.paused and not self.reading_paused:
            transport = self.transport
            if transport.get_write_buffer_size() > self.limits.output_limit and not transport.is_closing():
                # The client is not reading what it is sent: stop reading what it sends.
                self.reading_paused = True
                transport.pause_reading()

    def _on_headers(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolError(PROTOCOL_ERROR, "HEADERS on stream 0")
        start = 0
        stop = len(payload)
        if flags & FLAG_PADDED:
            if stop < 1:
                raise ProtocolError(PROTOCOL_ERROR, "bad padding")
            pad = payload[0]
            start = 1
            stop -= pad
        if flags & FLAG_PRIORITY:
            start += 5
        if stop < start:
            raise ProtocolError(PROTOCOL_ERROR, "bad HEADERS frame")
        block = payload[start:stop] if (start or stop != len(payload)) else payload
        if flags & FLAG_END_HEADERS:
            self._on_header_block(stream_id, flags, block)
        else:
            self.headers.begin(stream_id, flags, block)

    def _on_continuation(self, stream_id: int, flags: int, payload: bytes) -> None:
        block = self.headers.continuation(stream_id, payload, bool(flags & FLAG_END_HEADERS))
        if block is not None:
            self._on_header_block(stream_id, self.headers.flags, block)

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        # Decoded even when the stream is refused: the HPACK state must follow every block.
        headers, size = self.headers.decode(block)
        s = self.streams.get(stream_id)
        if s is not None:
            # Trailers from the client: only their END_STREAM matters.
            if s.remote_closed:
                self._stream_error(s, STREAM_CLOSED)
            elif not flags & FLAG_END_STREAM:
                self._stream_error(s, PROTOCOL_ERROR)  # a second header block must end the stream
            else:
                self.remote_end(s)
            return
        if not stream_id & 1:
            raise ProtocolError(PROTOCOL_ERROR, "clients open odd-numbered streams")
        if stream_id <= self.last_stream_id:
            if stream_id in self.recent_ids:
                self._refuse(stream_id, STREAM_CLOSED)  # HEADERS on a stream that is closed
                return
            raise ProtocolError(PROTOCOL_ERROR, "a new stream id lower than an earlier one")
        self.last_stream_id = stream_id
        self.recent_ids.append(stream_id)
        if self.goaway_sent or len(self.streams) >= self.limits.max_concurrent_streams:
            self._refuse(stream_id, REFUSED_STREAM)
            return
        s = self.stream_type(stream_id, self.peer_initial_window, self.limits.initial_window)
        self.streams[stream_id] = s
        if size > self.limits.max_header_list_size:
            self.on_oversized_headers(s, size)
            return
        self.on_request(s, headers, bool(flags & FLAG_END_STREAM))

    def _refuse(self, stream_id: int, code: int) -> None:
        """RST_STREAM for a stream never started; a flood of them is a rapid-reset attack."""
        if not self.reset_rate.allow():
            raise ProtocolError(ENHANCE_YOUR_CALM, "too many refused or reset streams", b"too_many_resets")
        self.write(frame(RST_STREAM, 0, stream_id, U32.pack(code)))

    def _stream_error(self, s: Stream, code: int) -> None:
        """A stream error (RFC 9113 section 5.4.2): the stream's work stops and it is reset."""
        self.abandon(s)
        self.write(frame(RST_STREAM, 0, s.id, U32.pack(code)))

    def remote_end(self, s: Stream) -> None:
        """The client's half of the stream is closed: tell the application once."""
        if s.remote_closed:
            return
        s.remote_closed = True
        self.on_end_stream(s)

    def _on_settings(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & FLAG_ACK:
            if payload:
                raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise ProtocolError(FRAME_SIZE_ERROR, "bad SETTINGS length")
        if not self.settings_seen:
            self.settings_seen = True
            self.clock.handshake_done()
        elif not self.settings_rate.allow():
            raise ProtocolError(ENHANCE_YOUR_CALM, "SETTINGS flood", b"too_many_settings")
        for off in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, off)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for s in self.streams.values():
                    s.send_window += delta
                    if s.send_window > MAX_WINDOW:
                        raise ProtocolError(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE overflows a window")
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 16_384 <= value <= 16_777_215:
                    raise ProtocolError(PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self.peer_max_frame = value
            # header table size: this server's encoder never uses the dynamic table
        self._control_ack(frame(SETTINGS, FLAG_ACK, 0))
        if self.blocked:
            for s in list(self.blocked.values()):
                self._pump(s)

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE length")
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE with a zero increment")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "connection window overflow")
            for s in list(self.blocked.values()):
                self._pump(s)
                if self.send_window <= 0:
                    break
            return
        if stream_id > self.last_stream_id:
            raise ProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
        s = self.streams.get(stream_id)
        if s is not None:
            if increment == 0:
                self._stream_error(s, PROTOCOL_ERROR)
                return
            s.send_window += increment
            if s.send_window > MAX_WINDOW:
                self._stream_error(s, FLOW_CONTROL_ERROR)
                return
            if s.pending:
                self._pump(s)

    def _on_ping(self, flags: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise ProtocolError(FRAME_SIZE_ERROR, "bad PING length")
        if flags & FLAG_ACK:
            self.clock.ping_acked()
            return
        if self.sent_data:
            self.sent_data = False
            self.pings.reset()
        if self.pings.bad(idle=not self.streams):
            raise ProtocolError(ENHANCE_YOUR_CALM, "too many pings", b"too_many_pings")
        self._control_ack(frame(PING, FLAG_ACK, 0, payload))

    def _control_ack(self, data: bytes) -> None:
        """Acknowledge a PING or SETTINGS, unless the client lets acknowledgements pile up unread."""
        self.control_queued += 1
        if self.control_queued > self.limits.max_queued_control_frames:
            if self.transport.get_write_buffer_size() > self.limits.max_queued_control_frames * 9:
                raise ProtocolError(ENHANCE_YOUR_CALM, "control frames flood", b"flood")
            self.control_queued = 0  # what was queued has been read
        self.write(data)

    def _on_rst_stream(self, stream_id: int, length: int) -> None:
        if length != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "bad RST_STREAM length")
        if stream_id == 0 or stream_id > self.last_stream_id:
            raise ProtocolError(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        s = self.streams.pop(stream_id, None)
        if s is not None:
            self.abandon(s)
            if not self.reset_rate.allow():
                raise ProtocolError(ENHANCE_YOUR_CALM, "too many reset streams", b"too_many_resets")

    def _on_goaway(self) -> None:
        # The client will open no new streams; close once the current ones are done.
        self.closing = True
        if not self.streams:
            self.close_soon()

    # ---- stream state ---------------------------------------------------------------

    def close_stream(self, s: Stream) -> None:
        """The stream is over (or abandoned): the application stops its work, the connection forgets it."""
        s.closed = True
        self.on_closed(s)
        if self.blocked:
            self.unblock(s)
        self.streams.pop(s.id, None)
        if not self.streams:
            self.idle_since = self.loop.time()
            if self.closing:
                self.close_soon()

    def abandon(self, s: Stream) -> None:
        """The client reset the stream or the connection dropped: stop its work, write nothing."""
        s.pending.clear()
        s.pending_bytes = 0
        s.trailers = None
        self.close_stream(s)

    # ---- connection control -------------------------------------------------------

    def goaway(self, code: int = NO_ERROR, debug: bytes = b"") -> None:
        if not self.goaway_sent:
            self.goaway_sent = True
            self.write(frame(GOAWAY, 0, 0, GOAWAY_PAYLOAD.pack(self.last_stream_id, code) + debug))

    def shutdown(self) -> None:
        """Graceful stop: no new streams; the connection closes when its streams are done."""
        self.goaway(NO_ERROR)
        self.closing = True
        if not self.streams:
            self.close_soon()

    def close_soon(self, linger: Optional[float] = None) -> None:
        self.loop.call_soon(self.close_now, self.linger if linger is None else linger)

    def close_now(self, linger: Optional[float] = None) -> None:
        """Hand what is queued to the client and close; drop it if it is not read within `linger`
        seconds (the connection's `linger` when not given)."""
        if linger is None:
            linger = self.linger
        if self.flush_handle is not None:
            self.flush_handle.cancel()
        self.flush()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()
            # close() waits until the queued output is read: a client that never reads is dropped.
            self.loop.call_later(linger, transport.abort)

    # ---- the connection as a holder of unread output (kernel.core.holding.Holder) -------------

    def held_bytes(self) -> int:
        """Bytes the transport could not hand to the socket: the client is not reading them."""
        transport = self.transport
        return 0 if transport is None else transport.get_write_buffer_size()

    def cut(self, reason: str) -> None:
        """The client has read nothing for the stall timeout (or the server holds too much): drop
        the connection and everything queued for it."""
        log.info("dropping an HTTP/2 connection: %s", reason)
        self.failed = True
        reset(self.transport)
