"""The server side of one HTTP/2 connection (RFC 9113), as an asyncio Protocol.

It implements the connection preface, SETTINGS (and their acknowledgement),
HEADERS + CONTINUATION with HPACK decoding (the `hpack` package, behind a cache
of decoded header blocks), DATA with padding, flow control in both directions,
PING, RST_STREAM, GOAWAY and WINDOW_UPDATE, and server keepalive pings;
PRIORITY and unknown frame types are ignored and server push is never used.

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
import struct
import time
from typing import Optional

import hpack

from kernel.transports.grpc.http2.frames import (
    COMPRESSION_ERROR, CONTINUATION, DATA, DEFAULT_MAX_FRAME, DEFAULT_WINDOW, FLAG_ACK, FLAG_END_HEADERS,
    FLAG_END_STREAM, FLAG_PADDED, FLAG_PRIORITY, FLOW_CONTROL_ERROR, FRAME_HEADER, FRAME_SIZE_ERROR, GOAWAY,
    GOAWAY_PAYLOAD, HEADERS, MAX_WINDOW, NO_ERROR, PING, PREFACE, PROTOCOL_ERROR, PUSH_PROMISE, REFUSED_STREAM,
    RST_STREAM, SETTING, SETTINGS, SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE, U32, WINDOW_UPDATE, frame, frame_head,
)

log = logging.getLogger("kernel.grpc")

# What this server advertises. Large windows let big tensors arrive without
# waiting for window updates; large frames cut per-frame work for them.
LOCAL_WINDOW = 16 * 1024 * 1024
LOCAL_MAX_FRAME = 1024 * 1024
MAX_HEADER_BLOCK = 1024 * 1024


class Stream:
    """The HTTP/2 state of one stream; a subclass adds what the application keeps per request."""

    __slots__ = ("id", "recv_unacked", "send_window", "pending", "trailers", "remote_closed", "closed", "headers_sent")

    def __init__(self, stream_id: int, send_window: int):
        self.id = stream_id
        self.recv_unacked = 0
        self.send_window = send_window
        self.pending: collections.deque = collections.deque()  # DATA payloads waiting for window
        self.trailers: Optional[bytes] = None  # set once the answer is complete: sent after pending
        self.remote_closed = False
        self.closed = False
        self.headers_sent = False


class ProtocolError(Exception):
    """A connection error: answered with GOAWAY carrying `code`, then the connection closes."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class Http2Connection(asyncio.Protocol):
    """Server side of one HTTP/2 connection; the subclass supplies the `on_*` hooks."""

    stream_type = Stream

    def __init__(self, server):
        self.server = server  # has .loop, .connections and the keepalive settings
        self.loop = server.loop
        self.transport = None
        self.streams: dict[int, Stream] = {}
        self.partial: Optional[bytearray] = None  # an incomplete frame (or preface)
        self.partial_need = 0  # bytes partial must reach before it can be parsed
        self.preface_seen = False
        self.last_stream_id = 0
        self.decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_BLOCK)
        self.header_cache: dict[bytes, tuple] = {}
        self.table_generation = 0
        self.header_block: Optional[bytearray] = None  # HEADERS awaiting CONTINUATION
        self.header_stream = 0
        self.header_flags = 0
        # flow control
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self.recv_unacked = 0
        self.blocked: dict[int, Stream] = {}  # streams with output waiting for window
        # output coalescing: frames produced in one loop iteration leave in one write
        self.out: list = []
        self.flush_handle = None
        self.paused = False
        self.closing = False
        self.goaway_sent = False
        # keepalive
        self.ping_timer = None
        self.ping_deadline = None
        self.pings_without_data = 0

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
        settings = b"".join(
            SETTING.pack(k, v)
            for k, v in (
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_INITIAL_WINDOW_SIZE, LOCAL_WINDOW),
                (SETTINGS_MAX_FRAME_SIZE, LOCAL_MAX_FRAME),
                (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK),
            )
        )
        self.write(frame(SETTINGS, 0, 0, settings))
        self.write(frame(WINDOW_UPDATE, 0, 0, U32.pack(LOCAL_WINDOW - DEFAULT_WINDOW)))
        self._schedule_ping()

    def connection_lost(self, exc) -> None:
        self.closing = True
        self.server.connections.discard(self)
        for timer in (self.ping_timer, self.ping_deadline, self.flush_handle):
            if timer is not None:
                timer.cancel()
        streams, self.streams = self.streams, {}
        for s in streams.values():
            self.abandon(s)
        self.blocked.clear()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for s in list(self.blocked.values()):
            self._pump(s)

    # ---- input ----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        partial = self.partial
        if partial is not None:
            partial += data
            if len(partial) < self.partial_need:
                return
            buf = bytes(partial)
            self.partial = None
        else:
            buf = data
        pos = 0
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
                if end - start < length:
                    if length > LOCAL_MAX_FRAME:
                        raise ProtocolError(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                    break
                pos = start + length
                stream_id &= 0x7FFFFFFF
                if self.header_block is not None and kind != CONTINUATION:
                    raise ProtocolError(PROTOCOL_ERROR, "expected a CONTINUATION frame")
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
                    self._on_rst_stream(stream_id)
                elif kind == GOAWAY:
                    self._on_goaway()
                elif kind == PUSH_PROMISE:
                    raise ProtocolError(PROTOCOL_ERROR, "clients must not push")
                # PRIORITY and unknown frame types are ignored
        except ProtocolError as exc:
            log.debug("HTTP/2 protocol error from a client: %s", exc)
            self.goaway(exc.code)
            self.close_soon()
            return
        if pos < end:
            rest = bytearray(buf[pos:]) if pos else bytearray(buf)
            self.partial = rest
            if len(rest) >= 9:
                hi, lo = rest[0] << 8 | rest[1], rest[2]
                self.partial_need = 9 + ((hi << 8) | lo)
            else:
                self.partial_need = 9
        if self.recv_unacked >= LOCAL_WINDOW // 2:
            self.write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self.recv_unacked)))
            self.recv_unacked = 0

    def _on_data(self, stream_id: int, flags: int, buf, start: int, stop: int) -> None:
        size = stop - start
        self.recv_unacked += size
        if flags & FLAG_PADDED:
            if size < 1:
                raise ProtocolError(PROTOCOL_ERROR, "bad padding")
            pad = buf[start]
            start += 1
            stop -= pad
            if stop < start:
                raise ProtocolError(PROTOCOL_ERROR, "bad padding")
        s = self.streams.get(stream_id)
        if s is None or s.remote_closed:
            if stream_id == 0 or stream_id > self.last_stream_id:
                raise ProtocolError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we already closed: the data is dropped (window counted above)
        if start < stop:
            chunk = buf[start:stop]
            s.recv_unacked += size
            self.on_body(s, chunk)
            if not (flags & FLAG_END_STREAM) and s.recv_unacked >= LOCAL_WINDOW // 2 and not s.closed:
                self.write(frame(WINDOW_UPDATE, 0, stream_id, U32.pack(s.recv_unacked)))
                s.recv_unacked = 0
        if flags & FLAG_END_STREAM:
            self.remote_end(s)

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
            self.header_block = bytearray(block)
            self.header_stream = stream_id
            self.header_flags = flags

    def _on_continuation(self, stream_id: int, flags: int, payload: bytes) -> None:
        if self.header_block is None or stream_id != self.header_stream:
            raise ProtocolError(PROTOCOL_ERROR, "unexpected CONTINUATION frame")
        self.header_block += payload
        if len(self.header_block) > MAX_HEADER_BLOCK:
            raise ProtocolError(PROTOCOL_ERROR, "header block too large")
        if flags & FLAG_END_HEADERS:
            block = bytes(self.header_block)
            self.header_block = None
            self._on_header_block(stream_id, self.header_flags, block)

    def _decode_headers(self, block: bytes) -> list:
        cached = self.header_cache.get(block)
        if cached is not None and cached[0] == self.table_generation:
            return cached[1]
        table = self.decoder.header_table
        entries = table.dynamic_entries
        before = (len(entries), entries[0] if entries else None, table.maxsize)
        try:
            headers = self.decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise ProtocolError(COMPRESSION_ERROR, f"cannot decode header block: {exc}") from None
        after = (len(entries), entries[0] if entries else None, table.maxsize)
        if after[0] != before[0] or after[1] is not before[1] or after[2] != before[2]:
            # The block changed the decoder's table: earlier cache entries may now decode differently.
            self.table_generation += 1
            self.header_cache.clear()
        elif len(self.header_cache) < 256:
            self.header_cache[block] = (self.table_generation, headers)
        return headers

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._decode_headers(block)
        s = self.streams.get(stream_id)
        if s is not None:
            # Trailers from the client: only their END_STREAM matters.
            if flags & FLAG_END_STREAM:
                self.remote_end(s)
            return
        if stream_id <= self.last_stream_id or not stream_id & 1:
            if stream_id <= self.last_stream_id:
                return  # a late frame for a stream we have already forgotten
            raise ProtocolError(PROTOCOL_ERROR, "invalid stream id")
        self.last_stream_id = stream_id
        s = self.stream_type(stream_id, self.peer_initial_window)
        if self.goaway_sent:
            self.write(frame(RST_STREAM, 0, stream_id, U32.pack(REFUSED_STREAM)))
            return
        self.streams[stream_id] = s
        self.on_request(s, headers, bool(flags & FLAG_END_STREAM))

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
            return
        if len(payload) % 6:
            raise ProtocolError(FRAME_SIZE_ERROR, "bad SETTINGS length")
        for off in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, off)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for s in self.streams.values():
                    s.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 16_384 <= value <= 16_777_215:
                    raise ProtocolError(PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self.peer_max_frame = value
            # header table size: this server's encoder never uses the dynamic table
        self.write(frame(SETTINGS, FLAG_ACK, 0))
        if self.blocked:
            for s in list(self.blocked.values()):
                self._pump(s)

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE length")
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "connection window overflow")
            for s in list(self.blocked.values()):
                self._pump(s)
                if self.send_window <= 0:
                    break
            return
        s = self.streams.get(stream_id)
        if s is not None:
            s.send_window += increment
            if s.pending:
                self._pump(s)

    def _on_ping(self, flags: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise ProtocolError(FRAME_SIZE_ERROR, "bad PING length")
        if flags & FLAG_ACK:
            if self.ping_deadline is not None:
                self.ping_deadline.cancel()
                self.ping_deadline = None
            return
        self.write(frame(PING, FLAG_ACK, 0, payload))

    def _on_rst_stream(self, stream_id: int) -> None:
        s = self.streams.pop(stream_id, None)
        if s is not None:
            self.abandon(s)

    def _on_goaway(self) -> None:
        # The client will open no new streams; close once the current ones are done.
        self.closing = True
        if not self.streams:
            self.close_soon()

    # ---- output -----------------------------------------------------------------

    def send_whole(self, s: Stream, head_block: bytes, chunks: list, n: int, trailer_block: bytes) -> bool:
        """Headers, one n-byte DATA frame made of `chunks` and trailers, all in one write.

        The fast path of a small answer; False (nothing written) when a window,
        the peer's frame size or a paused transport does not allow it.
        """
        if n > self.peer_max_frame or n > self.send_window or n > s.send_window or self.paused:
            return False
        self.send_window -= n
        s.send_window -= n
        s.headers_sent = True
        sid = s.id
        self.close_stream(s)
        out = self.out
        out.append(frame(HEADERS, FLAG_END_HEADERS, sid, head_block))
        out.append(frame_head(DATA, 0, sid, n))
        out.extend(chunks)
        out.append(frame(HEADERS, FLAG_END_STREAM | FLAG_END_HEADERS, sid, trailer_block))
        self.pings_without_data = 0
        if not s.remote_closed:
            out.append(frame(RST_STREAM, 0, sid, U32.pack(NO_ERROR)))
        if self.streams:
            # Other streams are in flight: their answers may finish in this same
            # loop iteration, so gather them into one write.
            if self.flush_handle is None:
                self.flush_handle = self.loop.call_soon(self.flush)
        else:
            # The only stream on the connection: answer without waiting.
            if self.flush_handle is not None:
                self.flush_handle.cancel()
            self.flush()
        return True

    def send(self, s: Stream, heads: list, data: bytes, trailers: Optional[bytes]) -> None:
        """Write header frames, queue DATA (sent within flow-control windows), then the trailers."""
        for h in heads:
            self.write(h)
        if data:
            s.pending.append(memoryview(data))
        if trailers is not None:
            s.trailers = trailers
        self.pings_without_data = 0
        self._pump(s)

    def _pump(self, s: Stream) -> None:
        pending = s.pending
        write = self.write
        while pending:
            window = self.send_window if self.send_window < s.send_window else s.send_window
            if self.paused or window <= 0:
                self.blocked[s.id] = s
                return
            item = pending[0]
            n = len(item)
            take = min(n, window, self.peer_max_frame)
            write(frame_head(DATA, 0, s.id, take))
            if take == n:
                write(item)
                pending.popleft()
            else:
                write(item[:take])
                pending[0] = item[take:]
            self.send_window -= take
            s.send_window -= take
        self.blocked.pop(s.id, None)
        trailers = s.trailers
        if trailers is not None and not s.closed:
            self.close_stream(s)
            self.send_headers(s.id, trailers, end_stream=True)
            self.reset_if_open(s)

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        """A header block, split into HEADERS + CONTINUATION frames of the peer's frame size."""
        flags = FLAG_END_STREAM if end_stream else 0
        max_frame = self.peer_max_frame
        if len(block) <= max_frame:
            self.write(frame(HEADERS, flags | FLAG_END_HEADERS, stream_id, block))
            return
        self.write(frame(HEADERS, flags, stream_id, block[:max_frame]))
        rest = block[max_frame:]
        while rest:
            part, rest = rest[:max_frame], rest[max_frame:]
            self.write(frame(CONTINUATION, 0 if rest else FLAG_END_HEADERS, stream_id, part))

    def close_stream(self, s: Stream) -> None:
        """The stream is over (or abandoned): the application stops its work, the connection forgets it."""
        s.closed = True
        self.on_closed(s)
        self.blocked.pop(s.id, None)
        self.streams.pop(s.id, None)
        if self.closing and not self.streams:
            self.close_soon()

    def reset_if_open(self, s: Stream) -> None:
        # The answer is complete; if the client is still sending, tell it to stop.
        if not s.remote_closed:
            self.write(frame(RST_STREAM, 0, s.id, U32.pack(NO_ERROR)))

    def abandon(self, s: Stream) -> None:
        """The client reset the stream or the connection dropped: stop its work, write nothing."""
        s.pending.clear()
        s.trailers = None
        self.close_stream(s)

    def write(self, data: bytes) -> None:
        self.out.append(data)
        if self.flush_handle is None:
            self.flush_handle = self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_handle = None
        out, self.out = self.out, []
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            transport.write(b"".join(out))

    # ---- connection control -------------------------------------------------------

    def goaway(self, code: int = NO_ERROR) -> None:
        if not self.goaway_sent:
            self.goaway_sent = True
            self.write(frame(GOAWAY, 0, 0, GOAWAY_PAYLOAD.pack(self.last_stream_id, code)))

    def shutdown(self) -> None:
        """Graceful stop: no new streams; the connection closes when its streams are done."""
        self.goaway(NO_ERROR)
        self.closing = True
        if not self.streams:
            self.close_soon()

    def close_soon(self) -> None:
        self.loop.call_soon(self.close_now)

    def close_now(self) -> None:
        if self.flush_handle is not None:
            self.flush_handle.cancel()
        self.flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # ---- keepalive ------------------------------------------------------------------

    def _schedule_ping(self) -> None:
        interval = self.server.keepalive_time
        if interval:
            self.ping_timer = self.loop.call_later(interval, self._keepalive)

    def _keepalive(self) -> None:
        self.ping_timer = None
        server = self.server
        if self.transport is None or self.transport.is_closing():
            return
        allowed = server.keepalive_permit_without_calls or bool(self.streams)
        limit = server.max_pings_without_data
        if allowed and (limit == 0 or self.pings_without_data < limit) and self.ping_deadline is None:
            self.write(frame(PING, 0, 0, struct.pack(">Q", time.monotonic_ns() & (2**64 - 1))))
            self.pings_without_data += 1
            self.ping_deadline = self.loop.call_later(server.keepalive_timeout, self._keepalive_expired)
        self._schedule_ping()

    def _keepalive_expired(self) -> None:
        self.ping_deadline = None
        log.info("closing a gRPC connection: no answer to a keepalive ping")
        self.close_now()
