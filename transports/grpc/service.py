"""What each GRPCInferenceService RPC does, independent of the gRPC server library.

`InferenceService` implements the unary RPCs as plain methods from a request
message to a response message (raising KernelError on failure) and the
bidirectional ModelStreamInfer as a `StreamSession` driven by two callables:
an async iterator of incoming requests and an async `send`. The bindings in
grpclib_server.py (and grpcio_server.py) only move bytes and map errors to
gRPC statuses, so the server library can be swapped without touching this.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from typing import AsyncIterator, Awaitable, Callable, Optional

from kernel.errors import ErrorCode, KernelError
from kernel.request import InferRequest, InferResponse
from kernel.server import Server
from transports.grpc import codec
from transports.grpc.protos import grpc_service_pb2 as pb

log = logging.getLogger("kernel.grpc")

SERVICE = "inference.GRPCInferenceService"

_ModelInferResponse = pb.ModelInferResponse
_ModelStreamInferResponse = pb.ModelStreamInferResponse


def _unsupported(feature: str) -> KernelError:
    return KernelError(ErrorCode.UNSUPPORTED, f"{feature} is not supported by Kernel yet")


class InferenceService:
    """The RPCs of inference.GRPCInferenceService on top of the core server."""

    def __init__(self, server: Server):
        self.server = server
        # Unary infer calls and stream sessions currently running (for a
        # graceful stop: the transport waits for these before closing).
        self.active_infers = 0
        self.sessions: set[StreamSession] = set()

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

    # ---- features Kernel does not have yet -------------------------------------

    def ModelStatistics(self, msg):
        raise _unsupported("model statistics (ModelStatistics)")

    def RepositoryIndex(self, msg):
        raise _unsupported("model repository control (RepositoryIndex)")

    def RepositoryModelLoad(self, msg):
        raise _unsupported("model repository control (RepositoryModelLoad)")

    def RepositoryModelUnload(self, msg):
        raise _unsupported("model repository control (RepositoryModelUnload)")

    def SystemSharedMemoryStatus(self, msg):
        raise _unsupported("system shared memory (SystemSharedMemoryStatus)")

    def SystemSharedMemoryRegister(self, msg):
        raise _unsupported("system shared memory (SystemSharedMemoryRegister)")

    def SystemSharedMemoryUnregister(self, msg):
        raise _unsupported("system shared memory (SystemSharedMemoryUnregister)")

    def CudaSharedMemoryStatus(self, msg):
        raise _unsupported("CUDA shared memory (CudaSharedMemoryStatus)")

    def CudaSharedMemoryRegister(self, msg):
        raise _unsupported("CUDA shared memory (CudaSharedMemoryRegister)")

    def CudaSharedMemoryUnregister(self, msg):
        raise _unsupported("CUDA shared memory (CudaSharedMemoryUnregister)")

    def TraceSetting(self, msg):
        raise _unsupported("tracing (TraceSetting)")

    def LogSettings(self, msg):
        raise _unsupported("log settings (LogSettings)")

    # ---- inference -------------------------------------------------------------

    def _lookup(self, name: str, version: str):
        codec.check_version(version)
        return self.server.model(name, version)

    async def ModelInfer(self, msg) -> pb.ModelInferResponse:
        model = self._lookup(msg.model_name, msg.model_version)
        if model.decoupled:
            raise KernelError(
                ErrorCode.UNSUPPORTED,
                "ModelInfer RPC doesn't support models with decoupled transaction policy",
            )
        request, _ = codec.parse_infer_request(msg)
        future = asyncio.get_running_loop().create_future()
        request.on_response = _single_response(future)
        self.server.submit(request)
        self.active_infers += 1
        try:
            response = await future
        except asyncio.CancelledError:
            # Client cancelled, deadline passed or connection dropped.
            request.cancel()
            raise
        finally:
            self.active_infers -= 1
        if response.error is not None:
            raise response.error
        out = _ModelInferResponse()
        codec.fill_infer_response(out, response)
        return out

    def stream_session(self, send: Callable[[object], Awaitable[None]], grpc_error_mode: bool = False):
        return StreamSession(self, send, grpc_error_mode)

    def busy(self) -> bool:
        return self.active_infers > 0 or any(s.inflight for s in self.sessions)


def _single_response(future: asyncio.Future) -> Callable[[InferResponse], None]:
    """on_response for a unary call to a non-decoupled model: exactly one response."""

    def on_response(response: InferResponse) -> None:
        if not future.done():
            future.set_result(response)

    return on_response


class StreamError(Exception):
    """Ends a ModelStreamInfer call with a gRPC status (triton_grpc_error mode)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class StreamSession:
    """One ModelStreamInfer call.

    Requests are read and submitted as they arrive; responses are written by
    one writer loop in the order Triton writes them: responses to ordinary
    models in the order their requests arrived, responses from decoupled
    models as soon as they are produced. A failed request gets an in-stream
    error_message and the stream carries on; with the client header
    `triton_grpc_error: true` the first failure ends the stream with its gRPC
    status instead. When the client closes its side, the call ends once every
    request has sent its final response.
    """

    def __init__(self, service: InferenceService, send, grpc_error_mode: bool):
        self.service = service
        self.server = service.server
        self.send = send
        self.grpc_error_mode = grpc_error_mode
        self.outbox: collections.deque = collections.deque()
        self.ordered: collections.deque = collections.deque()  # [message or None] slots
        self.inflight: dict[int, InferRequest] = {}
        self.reading_done = False
        self.read_error: Optional[BaseException] = None
        self.error: Optional[StreamError] = None
        self._wake: Optional[asyncio.Future] = None
        self._ids = 0

    # ---- driving the call --------------------------------------------------------

    async def run(self, requests: AsyncIterator) -> None:
        """Serve the call to its end; raises StreamError to end it with a status."""
        self.service.sessions.add(self)
        reader = asyncio.ensure_future(self._read(requests))
        try:
            await self._write_loop()
        finally:
            self.service.sessions.discard(self)
            if not reader.done():
                reader.cancel()
            self._cancel_inflight()
        if self.error is not None:
            raise self.error
        if self.read_error is not None:
            raise self.read_error

    async def _read(self, requests: AsyncIterator) -> None:
        try:
            async for msg in requests:
                if self.error is not None:
                    break
                self.handle(msg)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the call's coroutine
            self.read_error = exc
        self.reading_done = True
        self._notify()

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        outbox = self.outbox
        while True:
            while outbox:
                await self.send(outbox.popleft())
            if self.error is not None or self.read_error is not None:
                return
            if self.reading_done and not self.inflight and not self.ordered:
                return
            self._wake = loop.create_future()
            await self._wake

    def _notify(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def _cancel_inflight(self) -> None:
        inflight, self.inflight = self.inflight, {}
        for request in inflight.values():
            request.cancel()

    # ---- one request -------------------------------------------------------------

    def handle(self, msg) -> None:
        slot = None
        decoupled = False
        request = None
        try:
            model = self.service._lookup(msg.model_name, msg.model_version)
            decoupled = model.decoupled
            if not decoupled:
                slot = [None]
                self.ordered.append(slot)
            request, empty_final = codec.parse_infer_request(msg)
            key = self._ids = self._ids + 1
            request.on_response = self._responder(key, request, msg.model_version, decoupled, empty_final, slot)
            self.inflight[key] = request
            try:
                self.server.submit(request)
            except BaseException:
                self.inflight.pop(key, None)
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
        out = _ModelStreamInferResponse(error_message=error.message)
        out.infer_response.id = request_id
        self._deliver(out, slot)

    def _responder(self, key: int, request: InferRequest, version: str, decoupled: bool, empty_final: bool, slot):
        request_id = request.id
        model_name = request.model_name

        def on_response(response: InferResponse) -> None:
            final = response.final
            if final:
                self.inflight.pop(key, None)
            if self.error is not None:
                return
            error = response.error
            if error is not None:
                if self.grpc_error_mode:
                    self._fail(error)
                    return
                out = _ModelStreamInferResponse(error_message=error.message)
                ir = out.infer_response
                ir.id = request_id
                ir.model_name = model_name
                ir.model_version = version
            elif decoupled and final and not response.outputs and not response.parameters:
                # The model only closed the response stream (FINAL flag, no data).
                if not empty_final:
                    self._notify()
                    return
                out = _ModelStreamInferResponse()
                ir = out.infer_response
                ir.id = request_id
                ir.model_name = model_name
                ir.model_version = version
            else:
                out = _ModelStreamInferResponse()
                ir = out.infer_response
                codec.fill_infer_response(ir, response)
            ir.parameters["triton_final_response"].bool_param = final
            self._deliver(out, slot)

        return on_response

    def _deliver(self, out, slot) -> None:
        if slot is None:
            self.outbox.append(out)
        else:
            slot[0] = out
            ordered = self.ordered
            while ordered and ordered[0][0] is not None:
                self.outbox.append(ordered.popleft()[0])
        self._notify()

    def _fail(self, error: KernelError) -> None:
        self.error = StreamError(codec.status_code(error), error.message)
        self._notify()
