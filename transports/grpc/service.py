"""What each GRPCInferenceService RPC does, independent of the gRPC server library.

`InferenceService` implements the unary RPCs as plain methods from a request
message to a response message (raising KernelError on failure), ModelInfer as
submit-plus-callback (`start_infer`) with a coroutine wrapper, and the
bidirectional ModelStreamInfer as a `StreamSession` (stream_session.py) that the
binding feeds requests and drains responses from. The bindings (native_server.py,
grpclib_server.py, grpcio_server.py) only move bytes and map errors to gRPC
statuses, so the server library can be swapped without touching this.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import AsyncIterator, Awaitable, Callable, Optional

from google.protobuf import json_format

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse
from kernel.core.server import Server
from kernel.core.shared_memory import RegionChange
from kernel.transports.grpc import codec
from kernel.transports.grpc import log_trace as settings
from kernel.transports.grpc import repository_api as repository
from kernel.transports.grpc.protos import grpc_service_pb2 as pb
from kernel.transports.grpc.stream_message import StreamMessage
from kernel.transports.grpc.stream_session import StreamSession
from kernel.transports.restrictions import grpc_category


SERVICE = "inference.GRPCInferenceService"

# The standard gRPC health service, which tritonserver also answers (Check only).
HEALTH_SERVICE = "grpc.health.v1.Health"


# Every unary RPC of GRPCInferenceService: name -> (request, response) message classes. The
# server bindings (native, grpclib, grpcio) route by it.
UNARY_RPCS = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse),
    "ModelStatistics": (pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
    "RepositoryIndex": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
    "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
    "RepositoryModelUnload": (pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
    "SystemSharedMemoryStatus": (pb.SystemSharedMemoryStatusRequest, pb.SystemSharedMemoryStatusResponse),
    "SystemSharedMemoryRegister": (pb.SystemSharedMemoryRegisterRequest, pb.SystemSharedMemoryRegisterResponse),
    "SystemSharedMemoryUnregister": (pb.SystemSharedMemoryUnregisterRequest, pb.SystemSharedMemoryUnregisterResponse),
    "CudaSharedMemoryStatus": (pb.CudaSharedMemoryStatusRequest, pb.CudaSharedMemoryStatusResponse),
    "CudaSharedMemoryRegister": (pb.CudaSharedMemoryRegisterRequest, pb.CudaSharedMemoryRegisterResponse),
    "CudaSharedMemoryUnregister": (pb.CudaSharedMemoryUnregisterRequest, pb.CudaSharedMemoryUnregisterResponse),
    "TraceSetting": (pb.TraceSettingRequest, pb.TraceSettingResponse),
    "LogSettings": (pb.LogSettingsRequest, pb.LogSettingsResponse),
}



def _no_repository_name(msg) -> None:
    if msg.repository_name:
        raise KernelError(ErrorCode.UNSUPPORTED, "'repository_name' specification is not supported")


class InferenceService:
    """The RPCs of inference.GRPCInferenceService on top of the core server."""

    def __init__(self, server: Server):
        self.server = server
        # Unary infer calls and stream sessions currently running (for a
        # graceful stop: the transport waits for these before closing).
        self.active_infers = 0
        self.sessions: set[StreamSession] = set()
        # --grpc-restricted-protocol (kernel.transports.restrictions.Restrictions); None when nothing is restricted.
        # The bindings check it per call, classifying calls with kernel.transports.restrictions.grpc_category.
        self.restricted = None
        # --grpc-header-forward-pattern (kernel.transports.header_forward.HeaderForwarder); None when unset.
        # The bindings then hand ModelInfer/ModelStreamInfer calls their client metadata.
        self.header_forward = None
        self.tracer = server.tracer
        # Answers the server holds for slow clients (kernel.core.holding): past its limit new
        # infer calls are refused with UNAVAILABLE instead of adding to it. None: not kept.
        self.held_output = getattr(server, "held_output", None)

    # ---- health --------------------------------------------------------------

    def ServerLive(self, msg) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.server.live)

    def ServerReady(self, msg) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.server.ready)

    async def ModelReady(self, msg) -> pb.ModelReadyResponse:
        codec.check_version(msg.version)
        ready = self.server.model_ready(msg.name, msg.version)
        if inspect.isawaitable(ready):  # the model's own is_ready() may be asked
            ready = await ready
        return pb.ModelReadyResponse(ready=ready)

    def HealthCheck(self, msg) -> "Serialized":
        """grpc.health.v1.Health/Check: SERVING while the server is ready, else NOT_SERVING.

        The request (which names a service) is not looked at, as in tritonserver.
        The reply is the one-field HealthCheckResponse, serialized by hand.
        """
        return Serialized(b"\x08\x01" if self.server.ready else b"\x08\x02")

    # ---- metadata ------------------------------------------------------------

    def ServerMetadata(self, msg) -> pb.ServerMetadataResponse:
        meta = self.server.metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])

    def ModelMetadata(self, msg) -> pb.ModelMetadataResponse:
        codec.check_version(msg.version)
        meta = self.server.model_metadata(msg.name, msg.version)
        TensorMetadata = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["inputs"]],
            outputs=[TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["outputs"]],
        )

    def ModelConfig(self, msg) -> pb.ModelConfigResponse:
        codec.check_version(msg.version)
        model = self.server.model(msg.name, msg.version)
        return pb.ModelConfigResponse(config=model.config)

    # ---- statistics extension ---------------------------------------------------

    async def ModelStatistics(self, msg) -> pb.ModelStatisticsResponse:
        # The core renders the statistics extension's JSON, whose field names are the proto's.
        doc = await self.server.total_statistics(msg.name, msg.version)
        return json_format.ParseDict(doc, pb.ModelStatisticsResponse())

    # ---- model repository extension (the core's kernel/loading/control.py) ----

    async def RepositoryIndex(self, msg) -> pb.RepositoryIndexResponse:
        _no_repository_name(msg)
        ModelIndex = pb.RepositoryIndexResponse.ModelIndex
        rows = await self.server.control.index(msg.ready)
        return pb.RepositoryIndexResponse(models=[ModelIndex(**row) for row in rows])

    async def RepositoryModelLoad(self, msg) -> pb.RepositoryModelLoadResponse:
        _no_repository_name(msg)
        config, files = repository.load_parameters(msg.parameters)
        await self.server.control.load(msg.model_name, config, files)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, msg) -> pb.RepositoryModelUnloadResponse:
        _no_repository_name(msg)
        await self.server.control.unload(msg.model_name, repository.unload_dependents(msg.parameters))
        return pb.RepositoryModelUnloadResponse()

    # ---- shared-memory extensions (regions live in the core: kernel/core/shared_memory.py) ----
    # A region's status dict uses the proto's field names, so it fills its map entry as is.

    def SystemSharedMemoryStatus(self, msg) -> pb.SystemSharedMemoryStatusResponse:
        regions = self.server.shared_memory.system_status(msg.name)
        return pb.SystemSharedMemoryStatusResponse(regions={region["name"]: region for region in regions})

    async def SystemSharedMemoryRegister(self, msg) -> pb.SystemSharedMemoryRegisterResponse:
        await self.server.change_shared_memory(
            RegionChange("register_system", msg.name, msg.key, msg.offset, msg.byte_size))
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, msg) -> pb.SystemSharedMemoryUnregisterResponse:
        await self.server.change_shared_memory(RegionChange("unregister_system", msg.name))
        return pb.SystemSharedMemoryUnregisterResponse()

    def CudaSharedMemoryStatus(self, msg) -> pb.CudaSharedMemoryStatusResponse:
        regions = self.server.shared_memory.cuda_status(msg.name)
        return pb.CudaSharedMemoryStatusResponse(regions={region["name"]: region for region in regions})

    async def CudaSharedMemoryRegister(self, msg) -> pb.CudaSharedMemoryRegisterResponse:
        # raw_handle is the cudaIpcMemHandle_t's 64 bytes themselves (tritonclient base64-decodes it).
        await self.server.change_shared_memory(RegionChange(
            "register_cuda", msg.name, raw_handle=msg.raw_handle, device_id=msg.device_id, byte_size=msg.byte_size))
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, msg) -> pb.CudaSharedMemoryUnregisterResponse:
        await self.server.change_shared_memory(RegionChange("unregister_cuda", msg.name))
        return pb.CudaSharedMemoryUnregisterResponse()

    # ---- trace and logging extensions ---------------------------------------------

    async def TraceSetting(self, msg) -> pb.TraceSettingResponse:
        return await settings.trace_setting(self.server, msg)

    async def LogSettings(self, msg) -> pb.LogSettingsResponse:
        return await settings.log_settings(self.server, msg)

    def restriction_denied(self, rpc: str, metadata) -> Optional[str]:
        """The header a call to `rpc` lacks when its group is restricted (None: allowed).

        `metadata`: (key, value) pairs of str. Only called when `restricted` is set.
        """
        rule = self.restricted.get(grpc_category(rpc))
        if rule is None:
            return None
        for key, value in metadata:
            if key == rule.header and value == rule.value:
                return None
        return rule.header

    # ---- inference -------------------------------------------------------------

    def lookup(self, name: str, version: str):
        """The model a request names (KernelError when it is not served)."""
        codec.check_version(version)
        return self.server.model(name, version)

    def start_infer(self, msg, on_done: Callable[[InferResponse], None], trace=None, metadata=None,
                    split=None) -> InferRequest:
        """Validate and submit a ModelInfer request; `on_done` gets its one response.

        Raises KernelError when the request is refused. The returned core
        request is what to cancel if the client goes away first. `trace`: the
        call's kernel.observe.trace.Trace when it was sampled (the caller releases it).
        `metadata`: the call's client metadata, given only when headers are forwarded.
        `split`: what codec.split_raw_inputs took out of the message (raw inputs, large typed contents).
        """
        held = self.held_output
        if held is not None and held.over_limit:
            raise KernelError(ErrorCode.UNAVAILABLE, held.refusal())
        model = self.lookup(msg.model_name, msg.model_version)
        if model.decoupled:
            raise KernelError(
                ErrorCode.UNSUPPORTED,
                "ModelInfer RPC doesn't support models with decoupled transaction policy",
            )
        request, _ = codec.parse_infer_request(msg, self.server.shared_memory, split)
        if metadata is not None and self.header_forward is not None:
            self.header_forward.apply_metadata(request, metadata)
        request.on_response = _once(on_done)
        request.trace = trace
        self.server.submit(request)
        return request

    @staticmethod
    def infer_reply(response: InferResponse) -> "Serialized":
        """The serialized ModelInferResponse for a response; raises its KernelError if it failed."""
        if response.error is not None:
            raise response.error
        return Serialized(codec.encode_infer_response(response))

    def ModelInfer(self, msg, metadata=None, split=None) -> Awaitable["Serialized"]:
        """ModelInfer for server libraries that run each call as a coroutine (await the result);
        `split` as for start_infer."""
        if self.tracer.active:  # all that tracing costs while it is off (kernel/observe/trace.py)
            return self._traced_model_infer(msg, metadata, split)
        return self._model_infer(msg, None, metadata, split)

    async def _traced_model_infer(self, msg, metadata, split) -> "Serialized":
        trace = self.tracer.sample(msg.model_name, self.tracer.context(metadata))
        if trace is None:
            return await self._model_infer(msg, None, metadata, split)
        trace.stamp("GRPC_WAITREAD_START")
        trace.stamp("GRPC_WAITREAD_END")
        try:
            return await self._model_infer(msg, trace, metadata, split)
        finally:
            trace.stamp("GRPC_SEND_END")
            trace.release()

    async def _model_infer(self, msg, trace, metadata=None, split=None) -> "Serialized":
        future = asyncio.get_running_loop().create_future()

        def done(response: InferResponse) -> None:
            if not future.done():  # the call may have been cancelled meanwhile
                future.set_result(response)

        request = self.start_infer(msg, done, trace, metadata, split)
        self.active_infers += 1
        try:
            response = await future
        except asyncio.CancelledError:
            # Client cancelled, deadline passed or connection dropped.
            request.cancel()
            raise
        finally:
            self.active_infers -= 1
        if trace is not None:
            trace.on_response(response)
            trace.stamp("GRPC_SEND_START")
        return self.infer_reply(response)

    def stream_session(
        self, on_ready: Callable[[], None], grpc_error_mode: bool = False, metadata=None
    ) -> "StreamSession":
        """`metadata`: the call's client metadata, given only when headers are forwarded."""
        return StreamSession(self, on_ready, grpc_error_mode, metadata)

    def busy(self) -> bool:
        return self.active_infers > 0 or any(s.inflight for s in self.sessions)


class Serialized:
    """An already-serialized message, for libraries that call SerializeToString() themselves."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 - the protobuf method name
        return self.data

    @classmethod
    def FromString(cls, data: bytes) -> "Serialized":  # noqa: N802
        """Stands in for a message type whose contents are not looked at."""
        return cls(data)


def _once(on_done: Callable[[InferResponse], None]) -> Callable[[InferResponse], None]:
    """on_response for a unary call to a non-decoupled model: the first response is the answer."""
    done = False

    def on_response(response: InferResponse) -> None:
        nonlocal done
        if not done:
            done = True
            on_done(response)

    return on_response


async def drive_stream(
    service: InferenceService,
    requests: AsyncIterator,
    send: Callable[[object], Awaitable[None]],
    grpc_error_mode: bool = False,
    metadata=None,
) -> None:
    """Serve one ModelStreamInfer call for a server library that runs calls as coroutines.

    `requests` yields codec.parse_infer_message's pairs until the client half-closes;
    `send` writes one ModelStreamInferResponse. Raises StreamError to end the
    call with a status, or whatever `requests` raised.
    """
    loop = asyncio.get_running_loop()
    wake: Optional[asyncio.Future] = None
    read_error: Optional[BaseException] = None

    def on_ready() -> None:
        if wake is not None and not wake.done():
            wake.set_result(None)

    session = service.stream_session(on_ready, grpc_error_mode, metadata)

    async def read() -> None:
        nonlocal read_error
        try:
            async for msg, split in requests:
                session.handle(msg, split)
                if session.error is not None:
                    return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the call's coroutine below
            read_error = exc
            on_ready()
            return
        session.end_of_input()

    reader = asyncio.ensure_future(read())
    try:
        outbox = session.outbox
        while True:
            while outbox:
                message = outbox.popleft()  # one bytes object per message for these libraries
                await send(Serialized(message.joined() if type(message) is StreamMessage else message))
            session.sent()
            if session.finished or read_error is not None:
                break
            wake = loop.create_future()
            await wake
    finally:
        if not reader.done():
            reader.cancel()
        session.cancel()
    if session.error is not None:
        raise session.error
    if read_error is not None:
        raise read_error
