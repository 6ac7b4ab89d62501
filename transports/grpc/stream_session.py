"""One ModelStreamInfer call, whichever gRPC server library carries it.

The service (service.py) makes a StreamSession per call; the binding feeds it the call's
requests and writes out what it puts in its outbox. Kept apart from the unary RPCs: how a
stream orders, paces and ends its answers is its own subject.
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING, Callable, Optional

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse
from kernel.transports.grpc import codec

if TYPE_CHECKING:
    from kernel.transports.grpc.service import InferenceService

log = logging.getLogger("kernel.grpc")


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

    def __init__(self, service: "InferenceService", on_ready: Callable[[], None], grpc_error_mode: bool,
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
            model = self.service.lookup(msg.model_name, msg.model_version)
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
