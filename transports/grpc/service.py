"""What each GRPCInferenceService RPC does, independent of the gRPC server library.

`InferenceService` implements the unary RPCs as plain methods from a request
message to a response message (raising KernelError on failure), ModelInfer as
submit-plus-callback (`start_infer`) with a coroutine wrapper, and the
bidirectional ModelStreamInfer as a `StreamSession` that the binding feeds
requests and drains responses from. The bindings (native_server.py,
grpclib_server.py, grpcio_server.py) only move bytes and map errors to gRPC
statuses, so the server library can be swapped without touching this.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
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
from kernel.transports.restrictions import grpc_category

log = logging.getLogger("kernel.grpc")

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

    def _lookup(self, name: str, version: str):
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
        model = self._lookup(msg.model_name, msg.model_version)
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

    def ModelInfer(self, msg, metadata=None) -> Awaitable["Serialized"]:
        """ModelInfer for server libraries that run each call as a coroutine (await the result)."""
        if self.tracer.active:  # all that tracing costs while it is off (kernel/observe/trace.py)
            return self._traced_model_infer(msg, metadata)
        return self._model_infer(msg, None, metadata)

    async def _traced_model_infer(self, msg, metadata) -> "Serialized":
        trace = self.tracer.sample(msg.model_name, self.tracer.context(metadata))
        if trace is None:
            return await self._model_infer(msg, None, metadata)
        trace.stamp("GRPC_WAITREAD_START")
        trace.stamp("GRPC_WAITREAD_END")
        try:
            return await self._model_infer(msg, trace, metadata)
        finally:
            trace.stamp("GRPC_SEND_END")
            trace.release()

    async def _model_infer(self, msg, trace, metadata=None) -> "Serialized":
        future = asyncio.get_running_loop().create_future()

        def done(response: InferResponse) -> None:
            if not future.done():  # the call may have been cancelled meanwhile
                future.set_result(response)

        request = self.start_infer(msg, done, trace, metadata)
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

    `requests` yields ModelInferRequest messages until the client half-closes;
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
            async for msg in requests:
                session.handle(msg)
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


class StreamError(Exception):
    """Ends a ModelStreamInfer call with a gRPC status (triton_grpc_error mode)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _end_stream_trace(request: InferRequest, response: InferResponse) -> None:
    """A traced ModelStreamInfer request got its final response: the stream lets go of its trace."""
    trace, request.trace = request.trace, None
    trace.on_response(response)
    trace.stamp("GRPC_SEND_START")
    trace.stamp("GRPC_SEND_END")
    trace.release()


URGENT_BYTES = 256 * 1024


class StreamSession:
    """One ModelStreamInfer call, driven by whichever server library carries it.

    The binding feeds it requests (`handle`), tells it when the client has
    finished sending (`end_of_input`) or has gone away (`cancel`), and writes
    out what appears in `outbox` (serialized ModelStreamInferResponse
    messages) whenever `on_ready` is called. The call is
    over when `finished` is true and the outbox is empty; `error` then says
    whether it ends with a non-OK status. `urgent` says that what waits
    includes something a binding that paces its writes must not hold back:
    a request's first or last response, an error, the end of the call, or
    URGENT_BYTES of responses (a write's worth: pacing saves wake-ups, it
    must not become a buffer).

    Responses leave in the order Triton writes them: responses to ordinary
    models in the order their requests arrived, responses from decoupled
    models as soon as they are produced. A failed request gets an in-stream
    error_message and the stream carries on; with the client header
    `triton_grpc_error: true` the first failed response ends the stream with
    its gRPC status instead.
    """

    def __init__(self, service: InferenceService, on_ready: Callable[[], None], grpc_error_mode: bool,
                 metadata=None):
        self.service = service
        self.server = service.server
        self.on_ready = on_ready
        self.grpc_error_mode = grpc_error_mode
        # The call's client metadata when headers are forwarded (every request gets them), else None.
        self.metadata = metadata
        self.outbox: collections.deque = collections.deque()
        self.ordered: collections.deque = collections.deque()  # [message or None] slots
        self.inflight: dict[int, InferRequest] = {}
        self.reading_done = False
        self.error: Optional[StreamError] = None
        self.urgent = False
        self.waiting = 0  # bytes put in the outbox since the binding last emptied it
        self._ids = 0
        service.sessions.add(self)

    @property
    def finished(self) -> bool:
        return self.error is not None or (self.reading_done and not self.inflight and not self.ordered)

    def end_of_input(self) -> None:
        self.reading_done = True
        self._wake_now()

    def _wake_now(self) -> None:
        """A request or the call ended: the binding writes what waits at once (it may end the call)."""
        self._closed_if_finished()
        self.urgent = True
        self.on_ready()

    def fail(self, code: int, message: str) -> None:
        """End the call with a status (e.g. an unparsable message); in-flight requests are cancelled."""
        if self.error is None:
            self.error = StreamError(code, message)
        self.cancel()
        self.urgent = True
        self.on_ready()

    def sent(self) -> None:
        """The binding took everything in the outbox: nothing urgent waits any more."""
        self.urgent = False
        self.waiting = 0

    def cancel(self) -> None:
        """The client went away or the call ended early: cancel what is still running."""
        self.service.sessions.discard(self)
        inflight, self.inflight = self.inflight, {}
        for request in inflight.values():
            request.cancel()

    def _closed_if_finished(self) -> None:
        if self.finished:
            self.service.sessions.discard(self)

    # ---- one request -------------------------------------------------------------

    def handle(self, msg, split=None) -> None:
        """One ModelStreamInfer request; `split`: what codec.split_raw_inputs took out of its message."""
        if self.error is not None:
            return
        slot = None
        decoupled = False
        request = None
        try:
            held = self.service.held_output
            if held is not None and held.over_limit:
                raise KernelError(ErrorCode.UNAVAILABLE, held.refusal())
            model = self.service._lookup(msg.model_name, msg.model_version)
            decoupled = model.decoupled
            if not decoupled:
                slot = [None]
                self.ordered.append(slot)
            request, empty_final = codec.parse_infer_request(msg, self.server.shared_memory, split)
            if self.metadata is not None:
                self.service.header_forward.apply_metadata(request, self.metadata)
            key = self._ids = self._ids + 1
            request.on_response = self._responder(key, request, msg.model_version, decoupled, empty_final, slot)
            self.inflight[key] = request
            if self.service.tracer.active:
                tracer = self.service.tracer
                request.trace = tracer.sample(msg.model_name, tracer.context(self.metadata))
            try:
                self.server.submit(request)
            except BaseException:
                self.inflight.pop(key, None)
                if request.trace is not None:
                    request.trace.release()
                raise
        except KernelError as exc:
            if slot is None and not decoupled:
                slot = [None]
                self.ordered.append(slot)
            self._refused(msg.id, exc, slot)
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the stream
            log.exception("unexpected error handling a ModelStreamInfer request")
            if slot is None and not decoupled:
                slot = [None]
                self.ordered.append(slot)
            self._refused(msg.id, KernelError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"), slot)

    def _refused(self, request_id: str, error: KernelError, slot) -> None:
        self._deliver(codec.stream_error(error.message, request_id), slot)

    def _responder(self, key: int, request: InferRequest, version: str, decoupled: bool, empty_final: bool, slot):
        request_id = request.id
        model_name = request.model_name
        first = True

        def on_response(response: InferResponse) -> None:
            nonlocal first
            final = response.final
            if final:
                self.inflight.pop(key, None)
                if request.trace is not None:
                    _end_stream_trace(request, response)
            if self.error is not None:
                return
            if slot is not None and slot[0] is not None:
                # A non-decoupled model's request has one answer, its first response, as Triton's
                # stream writes it: a model that sent its response with flags 0 and then only the
                # FINAL flag (or an error after it) must not replace it, even while it waits
                # behind an earlier request's answer.
                self._wake_now()
                return
            error = response.error
            if error is not None:
                if self.grpc_error_mode:
                    self._fail(error)
                    return
                out = codec.stream_error(error.message, request_id, model_name, version, final)
            elif decoupled and final and not response.outputs and not response.parameters:
                # The model only closed the response stream (FINAL flag, no data).
                if not empty_final:
                    self._wake_now()
                    return
                out = codec.stream_empty_final(request_id, model_name, version)
            else:
                out = codec.stream_response(response, final)
            urgent = first or final or error is not None
            first = False
            self._deliver(out, slot, urgent)

        return on_response

    def _deliver(self, out, slot, urgent: bool = True) -> None:
        if slot is None:
            self.outbox.append(out)
            self.waiting += len(out)
        else:
            slot[0] = out
            ordered = self.ordered
            while ordered and ordered[0][0] is not None:
                message = ordered.popleft()[0]
                self.outbox.append(message)
                self.waiting += len(message)
        if urgent or self.waiting >= URGENT_BYTES:
            self.urgent = True
        self._closed_if_finished()
        self.on_ready()

    def _fail(self, error: KernelError) -> None:
        self.fail(codec.status_code(error), error.message)
