"""GRPCInferenceService on Kernel's own HTTP/2 server: the fast path.

gRPC is a small subset of HTTP/2: POST requests whose bodies are
length-prefixed protobuf messages, answered with a fixed response header,
length-prefixed messages, and a trailer carrying `grpc-status`. This module
speaks exactly that subset as an asyncio Protocol, so a ModelInfer call costs
one frame parse, one protobuf decode, one core submit and one write, with no
gRPC library, HTTP/2 state machine or per-call coroutine in between
(benchmarks/results/grpc_servers.md has the measurements behind this).

What it implements of HTTP/2 (RFC 9113): the connection preface, SETTINGS
(and their acknowledgement), HEADERS + CONTINUATION with HPACK decoding
(the `hpack` package, behind a cache of decoded header blocks), DATA with
padding, flow control in both directions, PING, RST_STREAM, GOAWAY and
WINDOW_UPDATE; PRIORITY and unknown frame types are ignored. Server push is
never used. Responses are encoded without the HPACK dynamic table, so the
response header blocks are constants.

What it implements of gRPC: unary and bidirectional-streaming calls, message
framing, `grpc-timeout` deadlines, gzip/deflate request compression,
trailers-only error responses, status and percent-encoded `grpc-message`,
server keepalive pings (tritonserver's --grpc-keepalive-* settings), and
cancellation (RST_STREAM, deadline or a dropped connection cancel the core
requests of the call).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import socket
import logging
import ssl
import struct
import time
import zlib
from typing import Optional

import hpack
from google.protobuf.message import DecodeError

from kernel.core.errors import KernelError
from kernel.transports.restrictions import grpc_message
from kernel.transports.grpc import codec
from kernel.transports.grpc.metadata import client_metadata
from kernel.transports.grpc.protos import grpc_service_pb2 as pb
from kernel.transports.grpc.service import HEALTH_SERVICE, SERVICE, InferenceService, Serialized

log = logging.getLogger("kernel.grpc")

# ---------------------------------------------------------------- HTTP/2 constants (RFC 9113)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1

# What this server advertises. Large windows let big tensors arrive without
# waiting for window updates; large frames cut per-frame work for them.
LOCAL_WINDOW = 16 * 1024 * 1024
LOCAL_MAX_FRAME = 1024 * 1024
MAX_HEADER_BLOCK = 1024 * 1024

_FRAME_HEADER = struct.Struct(">HBBBL")  # 24-bit length split 16+8, type, flags, stream id
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_GOAWAY = struct.Struct(">LL")


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _FRAME_HEADER.pack(n >> 8, n & 0xFF, kind, flags, stream_id) + payload


def _frame_head(kind: int, flags: int, stream_id: int, n: int) -> bytes:
    return _FRAME_HEADER.pack(n >> 8, n & 0xFF, kind, flags, stream_id)


# ---------------------------------------------------------------- HPACK output (no dynamic table)


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A 'literal header field without indexing - new name', no Huffman coding."""
    return b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


# ':status: 200' is entry 8 of the static table; content-type is entry 31.
_RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + _hpack_int(len(b"application/grpc"), 7) + b"application/grpc"
_TRAILERS_OK = _literal(b"grpc-status", b"0")


def _status_block(code: int, message: str) -> bytes:
    block = _literal(b"grpc-status", str(code).encode())
    if message:
        block += _literal(b"grpc-message", _percent_encode(message))
    return block


def _percent_encode(message: str) -> bytes:
    raw = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


# gRPC C++ servers' answer to a request message that does not parse.
PARSE_ERROR = "Unable to parse request"

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def _parse_timeout(value: bytes) -> Optional[float]:
    try:
        return int(value[:-1]) * _TIMEOUT_UNITS[value[-1:]]
    except (KeyError, ValueError):
        return None


# ---------------------------------------------------------------- the service's methods

UNARY = 0
INFER = 1
STREAM = 2

_UNARY_TYPES = {
    "ServerLive": pb.ServerLiveRequest,
    "ServerReady": pb.ServerReadyRequest,
    "ModelReady": pb.ModelReadyRequest,
    "ServerMetadata": pb.ServerMetadataRequest,
    "ModelMetadata": pb.ModelMetadataRequest,
    "ModelConfig": pb.ModelConfigRequest,
    "ModelStatistics": pb.ModelStatisticsRequest,
    "RepositoryIndex": pb.RepositoryIndexRequest,
    "RepositoryModelLoad": pb.RepositoryModelLoadRequest,
    "RepositoryModelUnload": pb.RepositoryModelUnloadRequest,
    "SystemSharedMemoryStatus": pb.SystemSharedMemoryStatusRequest,
    "SystemSharedMemoryRegister": pb.SystemSharedMemoryRegisterRequest,
    "SystemSharedMemoryUnregister": pb.SystemSharedMemoryUnregisterRequest,
    "CudaSharedMemoryStatus": pb.CudaSharedMemoryStatusRequest,
    "CudaSharedMemoryRegister": pb.CudaSharedMemoryRegisterRequest,
    "CudaSharedMemoryUnregister": pb.CudaSharedMemoryUnregisterRequest,
    "TraceSetting": pb.TraceSettingRequest,
    "LogSettings": pb.LogSettingsRequest,
}


def method_table(service: InferenceService) -> dict[bytes, tuple]:
    """':path' -> (kind, request message type, service method)."""
    table: dict[bytes, tuple] = {}
    for name, req in _UNARY_TYPES.items():
        table[f"/{SERVICE}/{name}".encode()] = (UNARY, req, getattr(service, name))
    table[f"/{HEALTH_SERVICE}/Check".encode()] = (UNARY, Serialized, service.HealthCheck)
    table[f"/{SERVICE}/ModelInfer".encode()] = (INFER, pb.ModelInferRequest, None)
    table[f"/{SERVICE}/ModelStreamInfer".encode()] = (STREAM, pb.ModelInferRequest, None)
    return table


# ---------------------------------------------------------------- streams


class _Stream:
    """One HTTP/2 stream = one gRPC call."""

    __slots__ = (
        "id", "kind", "req_type", "method", "parts", "have", "need", "messages", "recv_unacked", "send_window",
        "pending", "trailers", "remote_closed", "closed", "headers_sent", "request", "session", "timer",
        "encoding", "grpc_error_mode", "flush_scheduled", "trace", "started_ns", "metadata", "denied",
    )

    def __init__(self, stream_id: int, send_window: int):
        self.id = stream_id
        self.kind = UNARY
        self.req_type = None
        self.method = None
        self.parts: list = []  # pieces of an incomplete request message
        self.have = 0  # bytes in parts
        self.need = 0  # bytes parts must reach before another message can complete
        self.messages: list = []  # complete unary request messages
        self.recv_unacked = 0
        self.send_window = send_window
        self.pending: collections.deque = collections.deque()  # DATA payloads waiting for window
        self.trailers: Optional[bytes] = None  # set once the call is finishing: sent after pending
        self.remote_closed = False
        self.closed = False
        self.headers_sent = False
        self.request = None  # core request of a ModelInfer call in flight
        self.session = None  # StreamSession of a ModelStreamInfer call
        self.timer = None
        self.encoding = b""
        self.grpc_error_mode = False
        self.flush_scheduled = False
        self.trace = None  # kernel.observe.trace.Trace of a sampled ModelInfer call
        self.started_ns = 0  # when its headers arrived (only taken while tracing is on)
        self.metadata = None  # client metadata of an infer call, kept only when headers are forwarded
        self.denied: Optional[str] = None  # a restricted call: the refusal, sent once its first message is read


class _ProtocolError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- one connection


class GrpcConnection(asyncio.Protocol):
    """Server side of one HTTP/2 connection carrying GRPCInferenceService calls."""

    def __init__(self, server: "NativeServer"):
        self.server = server
        self.service = server.service
        self.methods = server.methods
        self.restricted = server.service.restricted  # None when no RPC group is restricted
        self.header_forward = server.service.header_forward  # None unless --grpc-header-forward-pattern
        self.tracer = server.service.tracer
        self.loop = server.loop
        self.transport = None
        self.streams: dict[int, _Stream] = {}
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
        self.blocked: dict[int, _Stream] = {}  # streams with output waiting for window
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
            _SETTING.pack(k, v)
            for k, v in (
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_INITIAL_WINDOW_SIZE, LOCAL_WINDOW),
                (SETTINGS_MAX_FRAME_SIZE, LOCAL_MAX_FRAME),
                (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK),
            )
        )
        self._write(_frame(SETTINGS, 0, 0, settings))
        self._write(_frame(WINDOW_UPDATE, 0, 0, _U32.pack(LOCAL_WINDOW - DEFAULT_WINDOW)))
        self._schedule_ping()

    def connection_lost(self, exc) -> None:
        self.closing = True
        self.server.connections.discard(self)
        for timer in (self.ping_timer, self.ping_deadline, self.flush_handle):
            if timer is not None:
                timer.cancel()
        streams, self.streams = self.streams, {}
        for s in streams.values():
            self._abandon(s)
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
                    self._close_now()
                    return
                self.partial, self.partial_need = bytearray(buf), 24
                return
            if buf[:24] != PREFACE:
                self._close_now()
                return
            self.preface_seen = True
            pos = 24
        unpack = _FRAME_HEADER.unpack_from
        try:
            while end - pos >= 9:
                hi, lo, kind, flags, stream_id = unpack(buf, pos)
                length = (hi << 8) | lo
                start = pos + 9
                if end - start < length:
                    if length > LOCAL_MAX_FRAME:
                        raise _ProtocolError(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                    break
                pos = start + length
                stream_id &= 0x7FFFFFFF
                if self.header_block is not None and kind != CONTINUATION:
                    raise _ProtocolError(PROTOCOL_ERROR, "expected a CONTINUATION frame")
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
                    raise _ProtocolError(PROTOCOL_ERROR, "clients must not push")
                # PRIORITY and unknown frame types are ignored
        except _ProtocolError as exc:
            log.debug("HTTP/2 protocol error from a client: %s", exc)
            self._goaway(exc.code)
            self._close_soon()
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
            self._write(_frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.recv_unacked)))
            self.recv_unacked = 0

    def _on_data(self, stream_id: int, flags: int, buf, start: int, stop: int) -> None:
        size = stop - start
        self.recv_unacked += size
        if flags & FLAG_PADDED:
            if size < 1:
                raise _ProtocolError(PROTOCOL_ERROR, "bad padding")
            pad = buf[start]
            start += 1
            stop -= pad
            if stop < start:
                raise _ProtocolError(PROTOCOL_ERROR, "bad padding")
        s = self.streams.get(stream_id)
        if s is None or s.remote_closed:
            if stream_id == 0 or stream_id > self.last_stream_id:
                raise _ProtocolError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we already closed: the data is dropped (window counted above)
        if start < stop:
            chunk = buf[start:stop]
            s.recv_unacked += size
            self._on_body(s, chunk)
            if not (flags & FLAG_END_STREAM) and s.recv_unacked >= LOCAL_WINDOW // 2 and not s.closed:
                self._write(_frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(s.recv_unacked)))
                s.recv_unacked = 0
        if flags & FLAG_END_STREAM:
            self._on_end_stream(s)

    def _on_headers(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id == 0:
            raise _ProtocolError(PROTOCOL_ERROR, "HEADERS on stream 0")
        start = 0
        stop = len(payload)
        if flags & FLAG_PADDED:
            if stop < 1:
                raise _ProtocolError(PROTOCOL_ERROR, "bad padding")
            pad = payload[0]
            start = 1
            stop -= pad
        if flags & FLAG_PRIORITY:
            start += 5
        if stop < start:
            raise _ProtocolError(PROTOCOL_ERROR, "bad HEADERS frame")
        block = payload[start:stop] if (start or stop != len(payload)) else payload
        if flags & FLAG_END_HEADERS:
            self._on_header_block(stream_id, flags, block)
        else:
            self.header_block = bytearray(block)
            self.header_stream = stream_id
            self.header_flags = flags

    def _on_continuation(self, stream_id: int, flags: int, payload: bytes) -> None:
        if self.header_block is None or stream_id != self.header_stream:
            raise _ProtocolError(PROTOCOL_ERROR, "unexpected CONTINUATION frame")
        self.header_block += payload
        if len(self.header_block) > MAX_HEADER_BLOCK:
            raise _ProtocolError(PROTOCOL_ERROR, "header block too large")
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
            raise _ProtocolError(COMPRESSION_ERROR, f"cannot decode header block: {exc}") from None
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
            # Trailers from the client: only their END_STREAM matters to gRPC.
            if flags & FLAG_END_STREAM:
                self._on_end_stream(s)
            return
        if stream_id <= self.last_stream_id or not stream_id & 1:
            if stream_id <= self.last_stream_id:
                return  # a late frame for a stream we have already forgotten
            raise _ProtocolError(PROTOCOL_ERROR, "invalid stream id")
        self.last_stream_id = stream_id
        s = _Stream(stream_id, self.peer_initial_window)
        if self.goaway_sent:
            self._write(_frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        self.streams[stream_id] = s
        method = path = content_type = timeout = None
        for name, value in headers:
            if name[0] == 58:  # b":"
                if name == b":path":
                    path = value
                elif name == b":method":
                    method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                s.encoding = value
            elif name == b"triton_grpc_error":
                s.grpc_error_mode = value == b"true"
        if method != b"POST":
            self._http_error(s, b"405")
            return
        if content_type is None or not content_type.startswith(b"application/grpc"):
            self._http_error(s, b"415")
            return
        entry = self.methods.get(path)
        if entry is None:
            self._finish(s, codec.UNIMPLEMENTED, "")
            return
        if self.restricted is not None:
            denied = self.service.restriction_denied(
                path.decode("latin-1"), [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
            )
            if denied is not None:
                # tritonserver answers a restricted call with UNAVAILABLE once it has read the first
                # request message. Answering at the headers instead races the client's first send,
                # and grpcio's asyncio client then reports "Internal error from Core".
                s.denied = grpc_message(denied)
                if flags & FLAG_END_STREAM:
                    self._on_end_stream(s)
                return
        if self.tracer.active:
            s.started_ns = time.monotonic_ns()
        s.kind, s.req_type, s.method = entry
        if self.header_forward is not None and s.kind != UNARY:
            s.metadata = client_metadata(headers)
        if s.encoding and s.encoding not in (b"identity", b"gzip", b"deflate"):
            self._finish(s, codec.UNIMPLEMENTED, f"grpc-encoding '{s.encoding.decode('latin-1')}' is not supported")
            return
        if timeout is not None:
            seconds = _parse_timeout(timeout)
            if seconds is not None:
                s.timer = self.loop.call_later(seconds, self._deadline_expired, s)
        if s.kind == STREAM:
            s.session = self.service.stream_session(lambda: self._session_ready(s), s.grpc_error_mode, s.metadata)
        if flags & FLAG_END_STREAM:
            self._on_end_stream(s)

    def _on_settings(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id != 0:
            raise _ProtocolError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & FLAG_ACK:
            return
        if len(payload) % 6:
            raise _ProtocolError(FRAME_SIZE_ERROR, "bad SETTINGS length")
        for off in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, off)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ProtocolError(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for s in self.streams.values():
                    s.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 16_384 <= value <= 16_777_215:
                    raise _ProtocolError(PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self.peer_max_frame = value
            # header table size: this server's encoder never uses the dynamic table
        self._write(_frame(SETTINGS, FLAG_ACK, 0))
        if self.blocked:
            for s in list(self.blocked.values()):
                self._pump(s)

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ProtocolError(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE length")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise _ProtocolError(FLOW_CONTROL_ERROR, "connection window overflow")
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
            raise _ProtocolError(FRAME_SIZE_ERROR, "bad PING length")
        if flags & FLAG_ACK:
            if self.ping_deadline is not None:
                self.ping_deadline.cancel()
                self.ping_deadline = None
            return
        self._write(_frame(PING, FLAG_ACK, 0, payload))

    def _on_rst_stream(self, stream_id: int) -> None:
        s = self.streams.pop(stream_id, None)
        if s is not None:
            self._abandon(s)

    def _on_goaway(self) -> None:
        # The client will open no new streams; close once the current ones are done.
        self.closing = True
        if not self.streams:
            self._close_soon()

    # ---- one call --------------------------------------------------------------

    def _on_body(self, s: _Stream, chunk: bytes) -> None:
        if s.parts:
            s.parts.append(chunk)
            s.have += len(chunk)
            if s.have < s.need:
                return
            buf = b"".join(s.parts)
            s.parts = []
        else:
            buf = chunk
        pos = 0
        n = len(buf)
        while n - pos >= 5:
            length = _U32.unpack_from(buf, pos + 1)[0]
            if n - pos - 5 < length:
                break
            compressed = buf[pos]
            message = buf[pos + 5 : pos + 5 + length] if (pos or n != 5 + length) else buf[5:]
            pos += 5 + length
            if compressed:
                message = self._decompress(s, message)
                if message is None:
                    return
            self._on_message(s, message)
            if s.closed or s.trailers is not None:
                return
        if pos < n:
            rest = buf[pos:]
            s.parts = [rest]
            s.have = len(rest)
            s.need = 5 + _U32.unpack_from(rest, 1)[0] if len(rest) >= 5 else 5

    def _decompress(self, s: _Stream, message: bytes) -> Optional[bytes]:
        try:
            if s.encoding == b"gzip":
                return zlib.decompress(message, 16 + zlib.MAX_WBITS)
            if s.encoding == b"deflate":
                return zlib.decompress(message)
        except zlib.error as exc:
            self._finish(s, codec.INTERNAL, f"failed to decompress the request message: {exc}")
            return None
        self._finish(s, codec.INTERNAL, "compressed message without a grpc-encoding header")
        return None

    def _on_message(self, s: _Stream, message: bytes) -> None:
        if s.denied is not None:
            self._finish(s, codec.UNAVAILABLE, s.denied)
            return
        if s.kind == STREAM:
            if s.req_type is None:
                return  # reading stopped at an unparsable message
            try:
                msg = s.req_type.FromString(message)
            except DecodeError:
                # As gRPC C++ servers do, an unparsable message ends the reading side:
                # the call finishes normally once the requests before it are answered.
                s.req_type = None
                s.session.end_of_input()
                return
            s.session.handle(msg)
        else:
            s.messages.append(message)

    def _on_end_stream(self, s: _Stream) -> None:
        if s.remote_closed:
            return
        s.remote_closed = True
        if s.closed or s.trailers is not None:
            return
        if s.denied is not None:
            self._finish(s, codec.UNAVAILABLE, s.denied)
            return
        if s.parts:
            self._finish(s, codec.INTERNAL, "the request ended inside a message")
            return
        if s.kind == STREAM:
            if s.req_type is not None:
                s.session.end_of_input()
            return
        if len(s.messages) != 1:
            self._finish(s, codec.INTERNAL, f"a unary call takes exactly one request message, got {len(s.messages)}")
            return
        try:
            msg = s.req_type.FromString(s.messages[0])
        except DecodeError:
            self._finish(s, codec.INTERNAL, PARSE_ERROR)
            return
        s.messages = None
        if s.kind == INFER:
            self._start_infer(s, msg)
        else:
            self._call_unary(s, msg)

    def _start_infer(self, s: _Stream, msg) -> None:
        if self.tracer.active:
            s.trace = self.tracer.sample(msg.model_name)
            if s.trace is not None:
                s.trace.stamp("GRPC_WAITREAD_START", s.started_ns)
                s.trace.stamp("GRPC_WAITREAD_END")
        try:
            request = self.service.start_infer(
                msg, lambda response: self._infer_done(s, response), s.trace, s.metadata
            )
            if not s.closed and s.trailers is None:  # (unless it was answered on the spot)
                s.request = request
        except KernelError as exc:
            self._finish(s, codec.status_code(exc), exc.message)
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the connection down
            log.exception("unexpected error in ModelInfer")
            self._finish(s, codec.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

    def _infer_done(self, s: _Stream, response) -> None:
        s.request = None
        if s.closed or s.trailers is not None:
            return
        if s.trace is not None:
            s.trace.on_response(response)
            s.trace.stamp("GRPC_SEND_START")
        error = response.error
        if error is not None:
            self._finish(s, codec.status_code(error), error.message)
            return
        try:
            parts, size = codec.infer_response_parts(response)
        except Exception as exc:  # noqa: BLE001
            log.exception("unexpected error encoding a ModelInfer response")
            self._finish(s, codec.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
            return
        n = size + 5
        if n <= self.peer_max_frame and n <= self.send_window and n <= s.send_window and not self.paused:
            # The common case: headers, the whole message and the trailers in one write.
            self.send_window -= n
            s.send_window -= n
            s.headers_sent = True
            sid = s.id
            self._close_stream(s)
            out = self.out
            out.append(_frame(HEADERS, FLAG_END_HEADERS, sid, _RESPONSE_HEADERS))
            out.append(_frame_head(DATA, 0, sid, n))
            out.append(b"\x00" + _U32.pack(size))
            out.extend(parts)
            out.append(_frame(HEADERS, FLAG_END_STREAM | FLAG_END_HEADERS, sid, _TRAILERS_OK))
            self.pings_without_data = 0
            if not s.remote_closed:
                out.append(_frame(RST_STREAM, 0, sid, _U32.pack(NO_ERROR)))
            if self.streams:
                # Other calls are in flight: their responses may finish in this same
                # loop iteration, so gather them into one write.
                if self.flush_handle is None:
                    self.flush_handle = self.loop.call_soon(self._flush)
            else:
                # The only call on the connection: answer without waiting.
                if self.flush_handle is not None:
                    self.flush_handle.cancel()
                self._flush()
            return
        self._reply(s, b"".join(parts))

    def _call_unary(self, s: _Stream, msg) -> None:
        try:
            result = s.method(msg)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                s.request = task  # cancelled with the stream
                task.add_done_callback(lambda t: self._unary_done(s, t))
                return
        except KernelError as exc:
            self._finish(s, codec.status_code(exc), exc.message)
            return
        except Exception as exc:  # noqa: BLE001
            log.exception("unexpected error in a gRPC handler")
            self._finish(s, codec.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
            return
        self._reply(s, result.SerializeToString())

    def _unary_done(self, s: _Stream, task: asyncio.Task) -> None:
        s.request = None
        if s.closed or s.trailers is not None or task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, KernelError):
            self._finish(s, codec.status_code(exc), exc.message)
        elif exc is not None:
            log.error("unexpected error in a gRPC handler", exc_info=exc)
            self._finish(s, codec.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
        else:
            self._reply(s, task.result().SerializeToString())

    def _session_ready(self, s: _Stream) -> None:
        if s.closed or s.trailers is not None or s.flush_scheduled:
            return
        # Gather what the session produced in this loop iteration into one write.
        s.flush_scheduled = True
        self.loop.call_soon(self._flush_session, s)

    def _flush_session(self, s: _Stream) -> None:
        s.flush_scheduled = False
        if s.closed or s.trailers is not None:
            return
        session = s.session
        outbox = session.outbox
        if outbox:
            chunks = []
            if not s.headers_sent:
                s.headers_sent = True
                chunks.append(_frame(HEADERS, FLAG_END_HEADERS, s.id, _RESPONSE_HEADERS))
            data = []
            while outbox:
                body = outbox.popleft()
                data.append(b"\x00" + _U32.pack(len(body)))
                data.append(body)
            self._send(s, chunks, b"".join(data), None)
        if session.finished:
            error = session.error
            if error is not None:
                self._finish(s, error.code, error.message)
            else:
                self._finish(s, codec.OK, "")

    # ---- output -----------------------------------------------------------------

    def _reply(self, s: _Stream, body: bytes) -> None:
        """Headers, one message and OK trailers: the whole answer to a unary call."""
        if s.closed or s.trailers is not None:
            return
        s.headers_sent = True
        head = _frame(HEADERS, FLAG_END_HEADERS, s.id, _RESPONSE_HEADERS)
        self._send(s, [head], b"\x00" + _U32.pack(len(body)) + body, _TRAILERS_OK)

    def _finish(self, s: _Stream, code: int, message: str) -> None:
        """End the call with a status: trailers after a response, or a trailers-only response."""
        if s.closed or s.trailers is not None:
            return
        if s.headers_sent:
            self._send(s, [], b"", _status_block(code, message))
        else:
            s.headers_sent = True
            self._close_stream(s)
            self._write_headers(s.id, _RESPONSE_HEADERS + _status_block(code, message), end_stream=True)
            self._reset_if_open(s)

    def _http_error(self, s: _Stream, status: bytes) -> None:
        self._close_stream(s)
        self._write_headers(s.id, _literal(b":status", status), end_stream=True)
        self._reset_if_open(s)

    def _send(self, s: _Stream, heads: list, data: bytes, trailers: Optional[bytes]) -> None:
        """Write header frames, queue DATA (sent within flow-control windows), then the trailers."""
        for h in heads:
            self._write(h)
        if data:
            s.pending.append(memoryview(data))
        if trailers is not None:
            s.trailers = trailers
        self.pings_without_data = 0
        self._pump(s)

    def _pump(self, s: _Stream) -> None:
        pending = s.pending
        write = self._write
        while pending:
            window = self.send_window if self.send_window < s.send_window else s.send_window
            if self.paused or window <= 0:
                self.blocked[s.id] = s
                return
            item = pending[0]
            n = len(item)
            take = min(n, window, self.peer_max_frame)
            write(_frame_head(DATA, 0, s.id, take))
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
            self._close_stream(s)
            self._write_headers(s.id, trailers, end_stream=True)
            self._reset_if_open(s)

    def _write_headers(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        flags = FLAG_END_STREAM if end_stream else 0
        max_frame = self.peer_max_frame
        if len(block) <= max_frame:
            self._write(_frame(HEADERS, flags | FLAG_END_HEADERS, stream_id, block))
            return
        self._write(_frame(HEADERS, flags, stream_id, block[:max_frame]))
        rest = block[max_frame:]
        while rest:
            part, rest = rest[:max_frame], rest[max_frame:]
            self._write(_frame(CONTINUATION, 0 if rest else FLAG_END_HEADERS, stream_id, part))

    def _close_stream(self, s: _Stream) -> None:
        """The call is over (or abandoned): stop its timer and any work still running."""
        s.closed = True
        if s.trace is not None:
            trace, s.trace = s.trace, None
            trace.stamp("GRPC_SEND_END")
            trace.release()
        if s.timer is not None:
            s.timer.cancel()
            s.timer = None
        request = s.request
        if request is not None:
            s.request = None
            request.cancel()
        if s.session is not None:
            s.session.cancel()
        self.blocked.pop(s.id, None)
        self.streams.pop(s.id, None)
        if self.closing and not self.streams:
            self._close_soon()

    def _reset_if_open(self, s: _Stream) -> None:
        # The call is over; if the client is still sending, tell it to stop.
        if not s.remote_closed:
            self._write(_frame(RST_STREAM, 0, s.id, _U32.pack(NO_ERROR)))

    def _abandon(self, s: _Stream) -> None:
        """The client reset the stream or the connection dropped: stop its work, write nothing."""
        s.pending.clear()
        s.trailers = None
        self._close_stream(s)

    def _deadline_expired(self, s: _Stream) -> None:
        s.timer = None
        if s.closed:
            return
        s.pending.clear()
        s.trailers = None
        if s.headers_sent:
            self._close_stream(s)
            self._write_headers(s.id, _status_block(codec.DEADLINE_EXCEEDED, "Deadline Exceeded"), end_stream=True)
            self._reset_if_open(s)
        else:
            self._finish(s, codec.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _write(self, data: bytes) -> None:
        self.out.append(data)
        if self.flush_handle is None:
            self.flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_handle = None
        out, self.out = self.out, []
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            transport.write(b"".join(out))

    # ---- connection control -------------------------------------------------------

    def _goaway(self, code: int = NO_ERROR) -> None:
        if not self.goaway_sent:
            self.goaway_sent = True
            self._write(_frame(GOAWAY, 0, 0, _GOAWAY.pack(self.last_stream_id, code)))

    def shutdown(self) -> None:
        """Graceful stop: no new calls; the connection closes when its calls are done."""
        self._goaway(NO_ERROR)
        self.closing = True
        if not self.streams:
            self._close_soon()

    def abort(self) -> None:
        for s in list(self.streams.values()):
            self._finish(s, codec.UNAVAILABLE, "the server is shutting down")
        self._close_soon()

    def _close_soon(self) -> None:
        self.loop.call_soon(self._close_now)

    def _close_now(self) -> None:
        if self.flush_handle is not None:
            self.flush_handle.cancel()
        self._flush()
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
            self._write(_frame(PING, 0, 0, struct.pack(">Q", time.monotonic_ns() & (2**64 - 1))))
            self.pings_without_data += 1
            self.ping_deadline = self.loop.call_later(server.keepalive_timeout, self._keepalive_expired)
        self._schedule_ping()

    def _keepalive_expired(self) -> None:
        self.ping_deadline = None
        log.info("closing a gRPC connection: no answer to a keepalive ping")
        self._close_now()


class NativeServer:
    """Listens and owns the connections of Kernel's own HTTP/2 gRPC server."""

    def __init__(self, service: InferenceService, options=None):
        self.service = service
        self.methods = method_table(service)
        self.loop = asyncio.get_event_loop()
        self.connections: set[GrpcConnection] = set()
        self._server: Optional[asyncio.AbstractServer] = None
        self.keepalive_time = (getattr(options, "keepalive_time_ms", 7_200_000) or 0) / 1000.0
        self.keepalive_timeout = getattr(options, "keepalive_timeout_ms", 20_000) / 1000.0
        self.keepalive_permit_without_calls = getattr(options, "keepalive_permit_without_calls", False)
        self.max_pings_without_data = getattr(options, "http2_max_pings_without_data", 2)

    async def start(self, address: str, port: int, ssl_context: Optional[ssl.SSLContext]) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: GrpcConnection(self), address, port, ssl=ssl_context, reuse_address=True, backlog=1024
        )

    def bound_port(self) -> Optional[int]:
        if self._server is None or not self._server.sockets:
            return None
        return self._server.sockets[0].getsockname()[1]

    async def stop(self, grace: float) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.shutdown()
        deadline = self.loop.time() + grace
        while self.loop.time() < deadline and any(
            any(s.request is not None or (s.session is not None and s.session.inflight) for s in c.streams.values())
            for c in self.connections
        ):
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            conn.abort()
        await asyncio.sleep(0)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
