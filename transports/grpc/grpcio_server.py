"""GRPCInferenceService bound to grpcio's asyncio server (gRPC C-core underneath).

Kept so the transport stays swappable and the measurements in
benchmarks/results/grpc_servers.md can be repeated; select it with
`GrpcOptions(server_library="grpcio")` or KERNEL_GRPC_SERVER=grpcio. grpcio is
not a runtime dependency of Kernel (it comes with tritonclient[grpc]).

--grpc-infer-response-compression-level becomes C-core's default compression level, which picks
the algorithm among those each client accepts as tritonserver does (compression.py) but applies
to the answers of every RPC: grpcio has no per-call level, its per-call algorithm ignores what
the client accepts, and it does not show a handler the client's grpc-accept-encoding. Clients
read compressed answers of the other RPCs all the same; Kernel's own server and grpclib
compress only infer answers, as tritonserver. C-core also deflates each answer on the thread
that runs the event loop, so a large one holds every other call meanwhile (16 MiB: 0.2-2 s on
the development box); Kernel's own server and grpclib deflate large answers beside the loop.
The server says so in its log when the flag is set.
"""

from __future__ import annotations

import inspect
import logging
import ssl
from typing import Optional

from kernel.core.errors import KernelError
from kernel.transports.restrictions import grpc_message
from kernel.transports.grpc import codec
from kernel.transports.grpc.compression import level_index
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


_UNPARSABLE = object()


def _serialize(message) -> bytes:
    # a protobuf message or service.Serialized: both have SerializeToString
    return message.SerializeToString()


def _lenient(parse):
    """A deserializer that hands back a marker instead of raising on a bad message. `parse`: a
    message type's FromString, or codec.parse_infer_message for the infer RPCs."""
    from google.protobuf.message import DecodeError

    def decode(data: bytes):
        try:
            return parse(data)
        except DecodeError:
            return _UNPARSABLE

    return decode


async def _until_unparsable(requests):
    async for msg in requests:
        if msg is _UNPARSABLE:
            return  # as gRPC C++ servers do: an unparsable message ends the reading side
        yield msg


class GrpcioServer:
    def __init__(self, service: InferenceService, options=None):
        import grpc
        from grpc import aio


        self.grpc = grpc
        self.service = service
        self.options = options
        self.codes = {c.value[0]: c for c in grpc.StatusCode}
        # C-core checks one receive limit against both a message's wire size and its size
        # once decompressed, so that limit is the decompression cap here: without it a few KB
        # of gzip inflate to gigabytes. (Kernel's own server keeps the two limits apart.)
        receive_limit = 64 * 1024 * 1024
        if options is not None:
            receive_limit = min(options.max_message_size, options.max_decompressed_size)
        channel_options = [
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", receive_limit),
        ]
        if options is not None:
            limits = options.http2_limits()
            channel_options += [
                ("grpc.keepalive_time_ms", options.keepalive_time_ms),
                ("grpc.keepalive_timeout_ms", options.keepalive_timeout_ms),
                ("grpc.keepalive_permit_without_calls", int(options.keepalive_permit_without_calls)),
                ("grpc.http2.max_pings_without_data", options.http2_max_pings_without_data),
                ("grpc.http2.max_ping_strikes", options.http2_max_ping_strikes),
                ("grpc.http2.min_ping_interval_without_data_ms", options.http2_min_recv_ping_interval_without_data_ms),
                ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
                ("grpc.max_metadata_size", limits.max_header_list_size),
            ]
            if options.max_connection_age_ms is not None:
                channel_options.append(("grpc.max_connection_age_ms", options.max_connection_age_ms))
            if options.max_connection_age_grace_ms is not None:
                channel_options.append(("grpc.max_connection_age_grace_ms", options.max_connection_age_grace_ms))
            level = level_index(options.infer_response_compression_level)
            if level:
                channel_options.append(("grpc.default_compression_level", level))  # C-core's levels: 1..3
                log.warning(
                    "--grpc-server grpcio compresses the answers of every RPC, on the event loop's thread: "
                    "a large answer holds every other call while it is compressed (--grpc-server native "
                    "compresses only infer answers, large ones beside the loop)"
                )
        self.server = aio.server(options=channel_options)
        handlers = {}
        guard = self._guard
        for name, (req, resp) in UNARY_RPCS.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                guard(name, self._unary(getattr(service, name))), request_deserializer=_lenient(req.FromString),
                response_serializer=resp.SerializeToString,
            )
        handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
            guard("ModelInfer", self._model_infer), request_deserializer=_lenient(codec.parse_infer_message),
            response_serializer=_serialize,
        )
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            guard("ModelStreamInfer", self._model_stream_infer),
            request_deserializer=_lenient(codec.parse_infer_message), response_serializer=_serialize,
        )
        health = {
            "Check": grpc.unary_unary_rpc_method_handler(
                guard("Check", self._unary(service.HealthCheck)), request_deserializer=Serialized.FromString,
                response_serializer=_serialize,
            )
        }
        self.server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler(SERVICE, handlers),
            grpc.method_handlers_generic_handler(HEALTH_SERVICE, health),
        ))
        self._port: Optional[int] = None

    def _guard(self, rpc: str, behavior):
        """`behavior`, refusing calls without the header when the RPC's group is restricted."""
        restricted = self.service.restricted
        if restricted is None or restricted.get(grpc_category(rpc)) is None:
            return behavior
        service = self.service

        async def guarded(request, context):
            denied = service.restriction_denied(rpc, context.invocation_metadata() or ())
            if denied is not None:
                if hasattr(request, "__anext__"):  # a stream: refuse after its first message (see grpclib_server)
                    try:
                        await request.__anext__()
                    except Exception:  # noqa: BLE001 - the refusal is the answer either way
                        pass
                await context.abort(self.grpc.StatusCode.UNAVAILABLE, grpc_message(denied))
            return await behavior(request, context)

        return guarded

    async def _abort(self, context, exc: KernelError):
        await context.abort(self.codes.get(codec.status_code(exc), self.grpc.StatusCode.UNKNOWN), exc.message)

    def _unary(self, method):
        async def handle(request, context):
            if request is _UNPARSABLE:
                await context.abort(self.grpc.StatusCode.INTERNAL, "Unable to parse request")
            try:
                response = method(request)
                if inspect.isawaitable(response):
                    response = await response
                return response
            except KernelError as exc:
                await self._abort(context, exc)

        return handle

    async def _model_infer(self, request, context):
        if request is _UNPARSABLE:
            await context.abort(self.grpc.StatusCode.INTERNAL, "Unable to parse request")
        metadata = None
        if self.service.header_forward is not None or self.service.tracer.otel is not None:
            # forwarded headers, or a W3C traceparent for OpenTelemetry tracing
            metadata = context.invocation_metadata() or ()
        msg, split = request
        try:
            return await self.service.ModelInfer(msg, metadata, split)
        except KernelError as exc:
            await self._abort(context, exc)

    async def _model_stream_infer(self, request_iterator, context):
        invocation_metadata = context.invocation_metadata() or ()
        grpc_error_mode = dict(invocation_metadata).get("triton_grpc_error") == "true"
        forwarded = invocation_metadata if self.service.header_forward is not None else None
        try:
            await drive_stream(
                self.service, _until_unparsable(request_iterator), context.write, grpc_error_mode, forwarded
            )
        except StreamError as exc:
            await context.abort(self.codes.get(exc.code, self.grpc.StatusCode.UNKNOWN), exc.message)

    async def start(self, address: str, port: int, ssl_context: Optional[ssl.SSLContext]) -> None:
        target = f"{address}:{port}"
        if ssl_context is None:
            self._port = self.server.add_insecure_port(target)
        else:
            opts = self.options

            def read(path):
                with open(path, "rb") as f:
                    return f.read()

            creds = self.grpc.ssl_server_credentials(
                [(read(opts.server_key), read(opts.server_cert))],
                root_certificates=read(opts.root_cert) if opts.root_cert else None,
                require_client_auth=bool(opts.use_ssl_mutual),
            )
            self._port = self.server.add_secure_port(target, creds)
        if not self._port:
            raise OSError(f"could not listen on {target} for gRPC")
        await self.server.start()

    def bound_port(self) -> Optional[int]:
        return self._port

    async def stop(self, grace: float) -> None:
        await self.server.stop(grace)
