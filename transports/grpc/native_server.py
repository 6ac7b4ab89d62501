"""GRPCInferenceService on Kernel's own HTTP/2 server: the fast path.

gRPC is a small subset of HTTP/2: POST requests whose bodies are
length-prefixed protobuf messages, answered with a fixed response header,
length-prefixed messages, and a trailer carrying `grpc-status`. This module
speaks exactly that subset on top of http2/connection.py, so a ModelInfer call
costs one frame parse, one protobuf decode, one core submit and one write, with
no gRPC library or per-call coroutine in between
(benchmarks/results/grpc_servers.md has the measurements behind this).

What it implements of gRPC: unary and bidirectional-streaming calls, message
framing, `grpc-timeout` deadlines, gzip/deflate request compression, compressed
infer answers (compressed_output.py), trailers-only error responses, status and
percent-encoded `grpc-message`, and cancellation (RST_STREAM, deadline or a dropped connection cancel the core
requests of the call). HTTP/2 itself (framing, HPACK, flow control, keepalive
pings, limits) lives in the http2 package, which knows nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
import time
from typing import Optional

from google.protobuf.message import DecodeError

from kernel.core.errors import KernelError
from kernel.transports import listen
from kernel.transports.restrictions import grpc_message
from kernel.transports.grpc import codec, compression
from kernel.transports.grpc.compressed_output import CompressedOutputMixin
from kernel.transports.grpc.call_state import INFER, STREAM, UNARY, GrpcStream
from kernel.transports.grpc.http2.connection import Http2Connection
from kernel.transports.grpc.http2.data_input import RECV_BUFFER
from kernel.transports.grpc.http2.frames import FLAG_END_HEADERS, HEADERS, U32, frame, literal
from kernel.transports.grpc.http2.limits import Http2Limits
from kernel.transports.grpc.message_input import MessageInputMixin
from kernel.transports.grpc.metadata import client_metadata
from kernel.transports.grpc.wire import (
    COMPRESSED_RESPONSE_HEADERS, PARSE_ERROR, RESPONSE_HEADERS, TRAILERS_OK, parse_timeout, status_block,
)
from kernel.transports.grpc.protos import grpc_service_pb2 as pb
from kernel.transports.grpc.service import HEALTH_SERVICE, SERVICE, UNARY_RPCS, InferenceService, Serialized
from kernel.transports.grpc.stream_message import StreamMessage
from kernel.transports.grpc.stream_pacing import StreamPacingMixin

log = logging.getLogger("kernel.grpc")

# ---------------------------------------------------------------- the service's methods

def method_table(service: InferenceService) -> dict[bytes, tuple]:
    """':path' -> (kind, request message type, service method)."""
    table: dict[bytes, tuple] = {}
    for name, (req, _) in UNARY_RPCS.items():
        table[f"/{SERVICE}/{name}".encode()] = (UNARY, req, getattr(service, name))
    table[f"/{HEALTH_SERVICE}/Check".encode()] = (UNARY, Serialized, service.HealthCheck)
    table[f"/{SERVICE}/ModelInfer".encode()] = (INFER, pb.ModelInferRequest, None)
    table[f"/{SERVICE}/ModelStreamInfer".encode()] = (STREAM, pb.ModelInferRequest, None)
    return table


class GrpcConnection(MessageInputMixin, CompressedOutputMixin, StreamPacingMixin, Http2Connection):
    """GRPCInferenceService calls over one HTTP/2 connection."""

    stream_type = GrpcStream

    def __init__(self, server: "NativeServer"):
        super().__init__(server)
        self.service = server.service
        self.methods = server.methods
        self.restricted = server.service.restricted  # None when no RPC group is restricted
        self.header_forward = server.service.header_forward  # None unless --grpc-header-forward-pattern
        self.tracer = server.service.tracer
        self.choose_encoding = server.choose_encoding  # None unless infer answers are compressed
        self.stream_write_interval = server.stream_write_interval  # seconds (0: writes are not paced)
        self.max_message_size = server.max_message_size
        self.max_decompressed_size = min(server.max_decompressed_size, server.max_message_size)
        self.ready: list = []  # unary calls whose request is complete, started once the read is handled
        self.max_buffered = server.max_buffered_per_connection
        self.reserved = 0  # declared sizes of the partial request messages of all calls
        # The server's account of partial request messages (kernel.core.holding; None: not kept),
        # and the holders it watches for this connection's calls (message_input.py).
        self.held_input = server.held_input
        self.partials: dict = {}
        # Answer bytes of its calls waiting to be compressed, and their holders (compressed_output.py).
        self.compress_held = 0
        self.compressing_calls: dict = {}

    # ---- a call starts ----------------------------------------------------------

    def on_request(self, s: GrpcStream, headers: list, end_stream: bool) -> None:
        method = path = content_type = timeout = accept = None
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
            elif name == b"grpc-accept-encoding":
                accept = value if accept is None else accept + b"," + value
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
                if end_stream:
                    self.remote_end(s)
                return
        if self.tracer.active:
            s.started_ns = time.monotonic_ns()
            s.trace_context = self.tracer.context(headers)  # a W3C traceparent (OpenTelemetry mode)
        s.kind, s.req_type, s.method = entry
        if self.header_forward is not None and s.kind != UNARY:
            s.metadata = client_metadata(headers)
        if self.choose_encoding is not None and s.kind != UNARY:
            s.out_encoding = self.choose_encoding(accept)
        if s.encoding and s.encoding not in (b"identity", b"gzip", b"deflate"):
            self._finish(s, codec.UNIMPLEMENTED, f"grpc-encoding '{s.encoding.decode('latin-1')}' is not supported")
            return
        if timeout is not None:
            seconds = parse_timeout(timeout)
            if seconds is not None:
                s.timer = self.loop.call_later(seconds, self._deadline_expired, s)
        if s.kind == STREAM:
            s.session = self.service.stream_session(lambda: self._session_ready(s), s.grpc_error_mode, s.metadata)
        if end_stream:
            self.remote_end(s)

    # ---- one call --------------------------------------------------------------

    def _on_message(self, s: GrpcStream, message: bytes) -> None:
        if s.denied is not None:
            self._finish(s, codec.UNAVAILABLE, s.denied)
            return
        if s.kind == STREAM:
            if s.req_type is None:
                return  # reading stopped at an unparsable message
            # A large message's raw_input_contents are taken out before protobuf parses the rest, as
            # for a unary call: parsing them holds the GIL (a 512 MiB tensor held the loop 0.6 s).
            try:
                msg, split = codec.parse_infer_message(message)
            except DecodeError:
                # As gRPC C++ servers do, an unparsable message ends the reading side:
                # the call finishes normally once the requests before it are answered.
                s.req_type = None
                s.session.end_of_input()
                return
            s.session.handle(msg, split)
        elif s.messages:
            # Nothing more is kept for a unary call than its one request.
            self._finish(s, codec.INTERNAL, "a unary call takes exactly one request message, got more")
        else:
            s.messages.append(message)

    def on_end_stream(self, s: GrpcStream) -> None:
        if self.partials:
            self.unwatch_message(s)
        if s.closed or s.trailers is not None:
            return
        if s.inflating is not None:
            s.end_pending = True  # handled once the message before it is inflated
            return
        if s.denied is not None:
            self._finish(s, codec.UNAVAILABLE, s.denied)
            return
        if s.parts or s.msg_view is not None:
            self._finish(s, codec.INTERNAL, "the request ended inside a message")
            return
        if s.kind == STREAM:
            if s.req_type is not None:
                s.session.end_of_input()
            return
        if len(s.messages) != 1:
            self._finish(s, codec.INTERNAL, f"a unary call takes exactly one request message, got {len(s.messages)}")
            return
        data = s.messages[0]
        try:
            if s.kind == INFER:
                msg, s.raws = codec.parse_infer_message(data)
            else:
                msg = s.req_type.FromString(data)
        except DecodeError:
            self._finish(s, codec.INTERNAL, PARSE_ERROR)
            return
        s.messages = None
        s.call = msg
        # Started once the whole read is handled: a RST_STREAM right behind the request
        # (the rapid-reset pattern) then cancels it before any work is done.
        self.ready.append(s)

    def on_input_done(self) -> None:
        ready = self.ready
        if not ready:
            return
        self.ready = []
        for s in ready:
            if s.closed or s.trailers is not None:
                continue
            msg, s.call = s.call, None
            if s.kind == INFER:
                self._start_infer(s, msg)
            else:
                self._call_unary(s, msg)

    def on_oversized_headers(self, s: GrpcStream, size: int) -> None:
        self._finish(
            s, codec.RESOURCE_EXHAUSTED,
            f"received header list of {size} bytes, over the limit of {self.limits.max_header_list_size}",
        )

    def _start_infer(self, s: GrpcStream, msg) -> None:
        if self.blocked or self.paused or self.compress_held:
            # Answers are waiting for this client to read them: past the connection's bound,
            # no more work is started for it.
            refusal = self._output_refusal(0)
            if refusal is not None:
                self._finish(s, codec.RESOURCE_EXHAUSTED, refusal)
                return
        if self.tracer.active:
            s.trace = self.tracer.sample(msg.model_name, s.trace_context)
            if s.trace is not None:
                s.trace.stamp("GRPC_WAITREAD_START", s.started_ns)
                s.trace.stamp("GRPC_WAITREAD_END")
        try:
            raws, s.raws = s.raws, None
            request = self.service.start_infer(
                msg, lambda response: self._infer_done(s, response), s.trace, s.metadata, raws
            )
            if not s.closed and s.trailers is None:  # (unless it was answered on the spot)
                s.request = request
        except KernelError as exc:
            self._finish(s, codec.status_code(exc), exc.message)
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the connection down
            log.exception("unexpected error in ModelInfer")
            self._finish(s, codec.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

    def _infer_done(self, s: GrpcStream, response) -> None:
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
        if s.out_encoding is not None:
            self.reply_compressed(s, parts, size)
            return
        n = size + 5
        if self.send_whole(s, RESPONSE_HEADERS, [b"\x00" + U32.pack(size), *parts], n, TRAILERS_OK):
            return
        if self.blocked or self.paused:
            refusal = self._output_refusal(n)
            if refusal is not None:
                # Dropped rather than held: the arena regions behind it are released now.
                self._finish(s, codec.RESOURCE_EXHAUSTED, refusal)
                return
        self._reply(s, parts, size)

    def _call_unary(self, s: GrpcStream, msg) -> None:
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
        body = result.SerializeToString()
        self._reply(s, [body], len(body))

    def _unary_done(self, s: GrpcStream, task: asyncio.Task) -> None:
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
            body = task.result().SerializeToString()
            self._reply(s, [body], len(body))

    def _flush_session(self, s: GrpcStream) -> None:
        s.flush_scheduled = False
        self.unpace(s)  # (when it was held and compressed_output.py calls it now)
        if s.closed or s.trailers is not None:
            return
        session = s.session
        session.sent()  # (the outbox is emptied below)
        s.last_write = self.loop.time()
        outbox = session.outbox
        if s.out_encoding is not None:
            if outbox or s.out_queue:
                ready = self.compressed_messages(s, outbox)
                if ready is None or ready[0] and not self.send_messages(s, *ready):
                    return
        elif outbox:
            data = []
            n = 0
            while outbox:
                body = outbox.popleft()
                data.append(b"\x00" + U32.pack(len(body)))
                if type(body) is StreamMessage:
                    data += body.parts  # framed where they lie, not joined
                else:
                    data.append(body)
                n += 5 + len(body)
            if not self.send_messages(s, data, n):
                return
        if session.finished and s.compressing is None and not s.out_queue:
            error = session.error
            if error is not None:
                self._finish(s, error.code, error.message)
            else:
                self._finish(s, codec.OK, "")

    # ---- output -----------------------------------------------------------------

    def send_messages(self, s: GrpcStream, data: list, n: int) -> bool:
        """Messages of a ModelStreamInfer call (n bytes, prefixes included), after the response
        headers if they have not gone yet; False when the call was cut instead (its client holds
        too much unread)."""
        chunks = []
        if not s.headers_sent:
            s.headers_sent = True
            head = RESPONSE_HEADERS if s.out_encoding is None else COMPRESSED_RESPONSE_HEADERS[s.out_encoding]
            chunks.append(frame(HEADERS, FLAG_END_HEADERS, s.id, head))
        if self.blocked or self.paused:
            refusal = self._output_refusal(n)
            if refusal is not None:
                for c in chunks:
                    self.write(c)
                self._cut(s, codec.RESOURCE_EXHAUSTED, refusal)
                return False
        self.send(s, chunks, data, None)
        return True

    def _reply(self, s: GrpcStream, parts: list, size: int) -> None:
        """Headers, one message (the `size` bytes of `parts`, not joined) and OK trailers: the
        whole answer to a unary call."""
        if s.closed or s.trailers is not None:
            return
        s.headers_sent = True
        head = frame(HEADERS, FLAG_END_HEADERS, s.id, RESPONSE_HEADERS)
        self.send(s, [head], [b"\x00" + U32.pack(size), *parts], TRAILERS_OK)

    def _finish(self, s: GrpcStream, code: int, message: str) -> None:
        """End the call with a status: trailers after a response, or a trailers-only response."""
        if s.closed or s.trailers is not None:
            return
        if s.headers_sent:
            self.send(s, [], b"", status_block(code, message))
        else:
            s.headers_sent = True
            self.close_stream(s)
            self.send_headers(s.id, RESPONSE_HEADERS + status_block(code, message), end_stream=True)
            self.reset_if_open(s)

    def _http_error(self, s: GrpcStream, status: bytes) -> None:
        self.close_stream(s)
        self.send_headers(s.id, literal(b":status", status), end_stream=True)
        self.reset_if_open(s)

    def _cut(self, s: GrpcStream, code: int, message: str) -> None:
        """End the call now with a status, dropping what it still had to send: the trailers go
        out at once (HEADERS are not flow-controlled), ahead of DATA the client never took."""
        if s.closed:
            return
        s.pending.clear()
        s.pending_bytes = 0
        s.trailers = None
        s.parts = []
        s.messages = []
        if s.headers_sent:
            self.close_stream(s)
            self.send_headers(s.id, status_block(code, message), end_stream=True)
            self.reset_if_open(s)
        else:
            self._finish(s, code, message)

    def _deadline_expired(self, s: GrpcStream) -> None:
        s.timer = None
        self._cut(s, codec.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def cut_stream(self, s: GrpcStream, reason: str) -> None:
        """The server's account of held bytes gave up on this call (it made no progress for the
        stall timeout, or the server holds too much): RESOURCE_EXHAUSTED with the reason."""
        self._cut(s, codec.RESOURCE_EXHAUSTED, reason)

    def _output_refusal(self, n: int) -> Optional[str]:
        """Why an answer of n more bytes (0: new work) may not be held on this connection, or None.

        One answer may always go when nothing else is held, however large it is."""
        held = self.held_output_bytes()
        limit = self.limits.max_pending_output
        if held and held + n > limit:
            return (f"answers waiting on this connection for the client to read them hold {held} bytes; "
                    f"{n} more would pass the limit of {limit} bytes per connection")
        return None

    def transfers(self) -> int:
        """Calls still receiving their request, running or writing their answer, and output the
        client has not read yet: what a graceful stop waits for. An idle ModelStreamInfer call
        (nothing in flight, nothing to send) is not one."""
        n = 0
        for s in self.streams.values():
            session = s.session
            if (session is None or session.inflight or session.outbox or s.pending or s.parts
                    or s.msg_view is not None or s.compressing is not None or s.out_queue
                    or s.inflating is not None):
                n += 1
        if not n and self.transport is not None and self.transport.get_write_buffer_size():
            n = 1
        return n

    def cut_all(self, message: str) -> None:
        """The exit timeout is spent: every call ends with UNAVAILABLE now and the connection is
        dropped, with whatever the client has not read."""
        for s in list(self.streams.values()):
            self._cut(s, codec.UNAVAILABLE, message)
        self.flush()
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def on_closed(self, s: GrpcStream) -> None:
        """Stop the call's timer and any work still running."""
        s.msg_view = None
        if s.inflating is not None:
            s.inflating.cancel()
            s.inflating = None
            s.held_back = []
        if s.out_encoding is not None:
            self.drop_compressed(s)
        if s.reserved:
            self._release(s)
        if self.partials:
            self.unwatch_message(s)
        if s.trace is not None:
            trace, s.trace = s.trace, None
            trace.stamp("GRPC_SEND_END")
            trace.release()
        if s.timer is not None:
            s.timer.cancel()
            s.timer = None
        self.unpace(s)
        request = s.request
        if request is not None:
            s.request = None
            request.cancel()
        if s.session is not None:
            s.session.cancel()

    def abort(self) -> None:
        for s in list(self.streams.values()):
            self._cut(s, codec.UNAVAILABLE, "the server is shutting down")
        self.close_soon()


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
        self.limits = options.http2_limits() if options is not None else Http2Limits()
        self.max_message_size = getattr(options, "max_message_size", 2**31 - 1)
        self.max_decompressed_size = getattr(options, "max_decompressed_size", 64 * 1024 * 1024)
        self.max_buffered_per_connection = getattr(options, "max_buffered_per_connection", 1 << 30)
        # --grpc-infer-response-compression-level: picks each infer call's algorithm (None: "none").
        level = compression.level_index(getattr(options, "infer_response_compression_level", "none"))
        self.choose_encoding = compression.Chooser(level) if level else None
        self.stream_write_interval = getattr(options, "stream_write_interval_ms", 1.0) / 1000.0
        # What the server holds for slow clients, all transports together (kernel.core.holding).
        core = getattr(service, "server", None)
        self.held_output = getattr(core, "held_output", None)
        self.held_input = getattr(core, "held_input", None)
        self.recv_buffer = memoryview(bytearray(RECV_BUFFER))  # shared by the connections (one loop)

    async def start(self, address: str, port: int, ssl_context: Optional[ssl.SSLContext]) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(  # (transports/listen.py: shared by several fronts)
            lambda: GrpcConnection(self), sock=listen.bind(address, port, "GRPC"), ssl=ssl_context, backlog=1024)

    def bound_port(self) -> Optional[int]:
        if self._server is None or not self._server.sockets:
            return None
        return self._server.sockets[0].getsockname()[1]

    def stop_accepting(self, grace: float) -> None:
        """The start of a graceful stop: no new connections; every connection gets GOAWAY (idle ones
        close at once, the others once their calls are done) and may take up to `grace` seconds to
        hand its last bytes to a slow reader."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.linger = max(grace, conn.linger)
            conn.shutdown()

    def transfers(self) -> int:
        """Calls being received, run or answered, over all connections (GrpcConnection.transfers)."""
        n = 0
        for conn in self.connections:
            n += conn.transfers()
        return n

    async def close(self) -> None:
        """The end of a graceful stop: whatever is still open is cut."""
        for conn in list(self.connections):
            conn.cut_all("the server is shutting down")
        await asyncio.sleep(0)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def stop(self, grace: float) -> None:
        """A whole graceful stop: calls and transfers get up to `grace` seconds, then the rest is cut."""
        self.stop_accepting(grace)
        deadline = self.loop.time() + grace
        while self.loop.time() < deadline and self.transfers():
            await asyncio.sleep(0.02)
        await self.close()
