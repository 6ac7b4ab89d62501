"""GRPCInferenceService bound to grpclib (pure-Python HTTP/2 on the front process's loop).

The handlers are written by hand from the service definition rather than
generated: each is a few lines that read one message, call InferenceService,
and map a KernelError onto the gRPC status Triton would send.

grpclib implements no compression. Compressed infer answers
(--grpc-infer-response-compression-level, compression.py) are written by `_send_compressed`
through the call's HTTP/2 stream, since grpclib's own methods refuse `grpc-*` headers and always
write an uncompressed message prefix.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
import time
from typing import Optional

from google.protobuf.message import DecodeError
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server as _GrpclibServer

from kernel.core.errors import KernelError
from kernel.transports import listen
from kernel.transports.restrictions import grpc_message
from kernel.transports.grpc import codec, compression
from kernel.transports.grpc.protos import grpc_service_pb2 as pb
from kernel.transports.grpc.service import (
    HEALTH_SERVICE,
    SERVICE,
    UNARY_RPCS,
    InferenceService,
    Serialized,
    drive_stream,
)
from kernel.transports.grpc.stream_session import StreamError
from kernel.transports.restrictions import grpc_category

log = logging.getLogger("kernel.grpc")

# rpc name -> (request type, response type); ModelInfer and ModelStreamInfer are bound separately.


def _grpc_error(exc: KernelError) -> GRPCError:
    return GRPCError(Status(codec.status_code(exc)), exc.message)


def _internal(exc: Exception) -> GRPCError:
    log.exception("unexpected error in a gRPC handler")
    return GRPCError(Status.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


async def _recv(stream):
    try:
        return await stream.recv_message()
    except DecodeError:
        raise GRPCError(Status.INTERNAL, "Unable to parse request") from None


class _InferRequest:
    """The request type of ModelInfer and ModelStreamInfer in the handler table: _Codec decodes
    their messages with codec.parse_infer_message, into (message, what it took out of it)."""


class _Codec:
    """grpclib codec without the per-message isinstance check of its default one."""

    __content_subtype__ = "proto"

    @staticmethod
    def encode(message, message_type) -> bytes:
        return message.SerializeToString()

    @staticmethod
    def decode(data: bytes, message_type):
        if message_type is _InferRequest:
            return codec.parse_infer_message(data)
        return message_type.FromString(data)


async def _send_compressed(stream, algorithm: bytes, body: bytes) -> None:
    """stream.send_message for a call whose answers are compressed with `algorithm`: the response
    headers name it, the message goes compressed when that makes it smaller (compression.message;
    large ones deflated beside the loop). Written through grpclib's HTTP/2 stream, keeping the
    bookkeeping its own send_message keeps (grpclib.server.Stream, grpclib 0.4)."""
    size = len(body)
    if size <= compression.INLINE_BYTES:
        chunks, _ = compression.message(algorithm, [body], size)
    else:
        chunks, _ = await compression.beside_loop(algorithm, [body], size)
    if not stream._send_initial_metadata_done:
        await stream._stream.send_headers(
            [(":status", "200"), ("content-type", stream._content_type), ("grpc-encoding", algorithm.decode())]
        )
        stream._send_initial_metadata_done = True
    await stream._stream.send_data(b"".join(chunks))
    stream._send_message_done = True
    stream._messages_sent += 1
    connection = stream._stream.connection
    connection.messages_sent += 1
    connection.last_message_sent = time.monotonic()


class GrpclibBinding:
    """grpclib's `IServable` for GRPCInferenceService."""

    def __init__(self, service: InferenceService, compression_level: str = "none"):
        self.service = service
        level = compression.level_index(compression_level)
        self.choose_encoding = compression.Chooser(level) if level else None

    def _encoding(self, stream) -> Optional[bytes]:
        """The algorithm of this infer call's answers (None: uncompressed), from the client's
        grpc-accept-encoding (grpclib keeps grpc-* headers out of stream.metadata; _HeadersKept
        leaves the request's headers on its HTTP/2 stream)."""
        if self.choose_encoding is None:
            return None
        accept = None
        for name, value in stream._stream.headers or ():
            if name == "grpc-accept-encoding":
                accept = value if accept is None else f"{accept},{value}"
        return self.choose_encoding(None if accept is None else accept.encode("latin-1"))

    def __mapping__(self) -> dict[str, Handler]:
        mapping = {}
        guard = self._guard
        for name, (req, resp) in UNARY_RPCS.items():
            mapping[f"/{SERVICE}/{name}"] = Handler(
                guard(name, self._unary(getattr(self.service, name))), Cardinality.UNARY_UNARY, req, resp
            )
        mapping[f"/{HEALTH_SERVICE}/Check"] = Handler(
            guard("Check", self._unary(self.service.HealthCheck)), Cardinality.UNARY_UNARY, Serialized, Serialized
        )
        mapping[f"/{SERVICE}/ModelInfer"] = Handler(
            guard("ModelInfer", self._model_infer), Cardinality.UNARY_UNARY, _InferRequest,
            pb.ModelInferResponse,
        )
        mapping[f"/{SERVICE}/ModelStreamInfer"] = Handler(
            guard("ModelStreamInfer", self._model_stream_infer), Cardinality.STREAM_STREAM, _InferRequest,
            pb.ModelStreamInferResponse,
        )
        return mapping

    def _guard(self, rpc: str, handler):
        """`handler`, refusing calls without the header when the RPC's group is restricted."""
        restricted = self.service.restricted
        if restricted is None or restricted.get(grpc_category(rpc)) is None:
            return handler
        service = self.service

        async def guarded(stream) -> None:
            denied = service.restriction_denied(rpc, (stream.metadata or {}).items())
            if denied is not None:
                # Refuse after the first request message, as tritonserver does: refusing before it
                # races the client's first send (grpcio's asyncio client then reports INTERNAL).
                try:
                    await stream.recv_message()
                except Exception:  # noqa: BLE001 - the refusal is the answer either way
                    pass
                raise GRPCError(Status.UNAVAILABLE, grpc_message(denied))
            await handler(stream)

        return guarded

    @staticmethod
    def _unary(method):
        async def handle(stream) -> None:
            msg = await _recv(stream)
            try:
                response = method(msg)
                if inspect.isawaitable(response):
                    response = await response
            except KernelError as exc:
                raise _grpc_error(exc) from None
            except Exception as exc:  # noqa: BLE001
                raise _internal(exc) from None
            await stream.send_message(response)

        return handle

    def _metadata(self, stream):
        """The call's client metadata for --grpc-header-forward-pattern; None when nothing is forwarded."""
        if self.service.header_forward is None and self.service.tracer.otel is None:
            return None
        pairs = list((stream.metadata or {}).items())
        if stream.user_agent:  # grpclib keeps it out of stream.metadata; gRPC C++ servers show it
            pairs.append(("user-agent", stream.user_agent))
        return pairs

    async def _model_infer(self, stream) -> None:
        received = await _recv(stream)
        if received is None:  # the client half-closed without a message (as the native server says it)
            raise GRPCError(Status.INTERNAL, "a unary call takes exactly one request message, got 0")
        msg, split = received
        try:
            response = await self.service.ModelInfer(msg, self._metadata(stream), split)
        except KernelError as exc:
            raise _grpc_error(exc) from None
        except Exception as exc:  # noqa: BLE001
            raise _internal(exc) from None
        algorithm = self._encoding(stream)
        if algorithm is None:
            await stream.send_message(response)
        else:
            await _send_compressed(stream, algorithm, response.data)

    async def _model_stream_infer(self, stream) -> None:
        metadata = stream.metadata or {}
        grpc_error_mode = metadata.get("triton_grpc_error") == "true"
        algorithm = self._encoding(stream)
        if algorithm is None:
            send = stream.send_message
        else:
            async def send(message) -> None:
                await _send_compressed(stream, algorithm, message.data)
        try:
            await drive_stream(
                self.service, _messages(stream), send, grpc_error_mode, self._metadata(stream)
            )
        except StreamError as exc:
            raise GRPCError(Status(exc.code), exc.message) from None


async def _messages(stream):
    while True:
        try:
            msg = await stream.recv_message()
        except DecodeError:
            return  # as gRPC C++ servers do: an unparsable message ends the reading side
        if msg is None:
            return
        yield msg


class _HeadersKept(_GrpclibServer):
    """grpclib's Server, leaving each call's request headers on its HTTP/2 stream (`headers`,
    which grpclib fills only for clients): grpclib hands them to its request handler alone."""

    def _protocol_factory(self):
        protocol = super()._protocol_factory()
        accept = protocol.handler.accept

        def keep_headers(stream, headers, release_stream) -> None:
            stream.headers = headers
            accept(stream, headers, release_stream)

        protocol.handler.accept = keep_headers
        return protocol


class GrpclibServer:
    """Owns the grpclib Server: listen, and stop gracefully."""

    def __init__(self, service: InferenceService, config=None, compression_level: str = "none"):
        from grpclib.config import Configuration

        self.service = service
        binding = GrpclibBinding(service, compression_level)
        server_type = _GrpclibServer if binding.choose_encoding is None else _HeadersKept
        self.server = server_type([binding], codec=_Codec(), config=config or Configuration())

    async def start(self, address: str, port: int, ssl_context: Optional[ssl.SSLContext]) -> None:
        # (several fronts share the port: transports/listen.py)
        await self.server.start(address, port, ssl=ssl_context, reuse_address=True, reuse_port=listen.shared_ports)

    def bound_port(self) -> Optional[int]:
        srv = self.server._server
        if srv is None or not srv.sockets:
            return None
        return srv.sockets[0].getsockname()[1]

    async def stop(self, grace: float) -> None:
        # Stop accepting connections, let in-flight inference finish, then close.
        if self.server._server is not None:
            self.server._server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self.service.busy() and loop.time() < deadline:
            await asyncio.sleep(0.02)
        self.server.close()
        await self.server.wait_closed()
