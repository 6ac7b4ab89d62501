"""A front's request path to one worker over one link: requests out, responses and executions back.

Requests are encoded straight onto the link's socket (no queue in between, so an idle worker never
waits on us); responses come back on it and go to each request's `on_response` on the loop.

A request's large inputs are copied once into this link's arena; each region is freed when the
worker gives it back (Release: the model's last array over it is gone) and no response view still
shows it. A batch with more than COPY_BESIDE_BYTES of them is copied on a thread (input_copy.py),
and its Execute leaves when the copy is done; batches submitted meanwhile wait behind it, so the
worker sees them in the order the scheduler gave. (One slice assignment of a 1 GiB gRPC input held
the front's loop ~1 s, a new segment's page faults included, and every other client with it.)
A cancelled request the model stays silent on is answered here after a grace period
(cancel_grace.py), so it holds neither its client, nor the pending count, nor shutdown.

Two kinds of instance share this: WorkerInstance (instance.py), which also owns the worker process
and its primary link (link 0: lifecycle, BLS, model control, custom metrics), and LinkedInstance
(link.py), another front process's link to the same worker. Each link has its own arenas, keys
(link L draws count(L + 256, 256), so a key names its link), pending table and executions.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import socket
import time
from typing import Optional

import msgspec

from kernel.backends.python import messages, wire
from kernel.backends.python.age_watch import AgeWatch
from kernel.backends.python.arena import Arena, PeerArena
from kernel.backends.python.arena_trim import IdleTrim
from kernel.backends.python.arena_views import ArenaViews
from kernel.backends.python.board import BoardView
from kernel.backends.python.cancel_grace import CancelGrace
from kernel.backends.python.gpu_front import DeviceTensors
from kernel.backends.python.input_copy import (
    COPY_BESIDE_BYTES, Built, copy_beside, copy_here, leave_out, running_loop, window_error,
)
from kernel.core.backend import BackendInstance, CoreHandle, ModelSource
from kernel.core.device_memory import kept_open, wire_form
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor, check_correlation_id

log = logging.getLogger("kernel.python")


class RequestPath(BackendInstance):
    link_id = 0  # the primary; LinkedInstance: its link (1..254)
    relay = False  # True for a front's relay to the supervisor (kernel/serve/fronts): requests carry their model
    takes_input_windows = True  # system shared-memory inputs are read straight into the arena (input_copy.py)

    def _init_path(self, source: ModelSource, name: str, kind: str, device_id: int, settings,
                   core: Optional[CoreHandle]) -> None:
        """What the instance is (both kinds take the same), and not healthy yet; then _reset_path."""
        self.source = source
        self.core = core
        self.name = name
        self.kind = kind
        self.device_id = device_id
        self.settings = settings  # instance.WorkerSettings
        self.healthy = False
        self._stopping = False
        # FORCE_CPU_ONLY_INPUT_TENSORS (backend.force_cpu_only_input_tensors checked its value): "no"
        # lets GPU inputs reach execute on the GPU; else the model takes host copies of them.
        param = source.config.parameters.get("FORCE_CPU_ONLY_INPUT_TENSORS")
        self._cpu_inputs = param is None or param.string_value != "no"

    def _reset_path(self) -> None:
        """Fresh state of the link: a restarted worker (or a replaced link) starts from here."""
        self.channel = None
        self._fd_sock = None
        suffix = f"-link{self.link_id}" if self.link_id else ""
        self._arena = Arena(
            self.settings.shm_default_byte_size, self.settings.shm_growth_byte_size, f"kernel-{self.name}{suffix}"
        )
        self._arena.on_new_segment = self._announce_segment
        self._peer = PeerArena()
        self._views = ArenaViews(self._arena, self._peer, self._send_release)  # outputs: views, no copy
        self._gpu = DeviceTensors(self)  # GPU tensors as CUDA IPC handles (gpu_front.py)
        self._trim = None  # made with the loop, at start
        self._pending: dict[int, InferRequest] = {}
        if getattr(self, "_cancelled", None) is not None:
            self._cancelled.close()
        self._cancelled = CancelGrace(lambda: self._pending, self._give_up_cancelled)
        self._input_regions: dict[int, list[tuple[int, int]]] = {}
        self._keys = itertools.count(256 + self.link_id, 256)
        self._ready_checks: dict[int, asyncio.Future] = {}  # CheckReady and Usage keys -> their answer
        self._executing = 0  # Execute messages whose execute() has not finished (schedulers, statistics)
        if getattr(self, "_copying", None) is not None:
            self._drop_copying(KernelError(ErrorCode.INTERNAL, f"Stub process '{self.name}' is not healthy."))
        self._copying: Optional[collections.deque] = None  # batches waiting behind a copy beside the loop
        self._held_back = 0  # requests of those batches and of the one being copied
        self._copy_epoch = object()  # replaced when the worker goes: a copy finishing later is void
        self._traced: dict[int, list] = {}  # Execute trace_key -> kernel.observe.trace.Trace of its traced requests
        if getattr(self, "_ages", None) is not None:
            self._ages.close()
        self._ages = AgeWatch(self.name, self.settings.request_age_warning_seconds, lambda: self._pending)
        self._has_is_ready = False
        self._async_execute = False
        if getattr(self, "_board", None) is not None:
            self._board.close()
        self._board = None  # the worker's load board (board.py), once it has other links

    def _start_trim(self, loop) -> None:
        self._trim = IdleTrim(self._arena, loop, self.settings.shm_idle_release_seconds, self._send_segment_removed)

    def _release_resources(self) -> None:
        self._ages.close()
        self._cancelled.close()
        self._views.close()
        self._arena.close()
        self._peer.close()
        if self._fd_sock is not None:
            self._fd_sock.close()
            self._fd_sock = None
        if self.channel is not None and self.channel.transport is not None:
            self.channel.transport.close()

    async def check_ready(self) -> tuple[bool, str]:
        """Healthy, and the model's own is_ready() (when it has one) says so."""
        if not self.healthy:
            return False, f"Stub process '{self.name}' is not healthy."
        if not self._has_is_ready:
            return True, ""
        # One is_ready() at a time: a query arriving while one runs (even one that already
        # outlived a query's timeout) waits for its answer instead of starting another.
        check = next((f for k, f in self._ready_checks.items() if k > 0), None)
        if check is None:
            key = next(self._keys)
            check = self._ready_checks[key] = asyncio.get_running_loop().create_future()
            self.channel.send(messages.CheckReady(key))
        try:
            ready, reason = await asyncio.wait_for(asyncio.shield(check), self.settings.is_ready_timeout_seconds)
        except asyncio.TimeoutError:
            ready, reason = False, f"is_ready() did not answer within {self.settings.is_ready_timeout_seconds:g} s"
        if not ready:
            log.warning("model instance '%s' is not ready: %s", self.name, reason)
        return ready, reason

    async def worker_usage(self, timeout: float = 10.0) -> messages.UsageReport:
        """What the worker holds now (its arena bytes, input arrays, open requests, links): diagnostics, tests."""
        key = -next(self._keys)  # negative: not a CheckReady
        fut = self._ready_checks[key] = asyncio.get_running_loop().create_future()
        self.channel.send(messages.Usage(key))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._ready_checks.pop(key, None)

    # ---- request path ----------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests handed to this instance and not answered: sent, or waiting for a copy beside the loop."""
        return len(self._pending) + self._held_back

    @property
    def load(self) -> int:
        """Requests the worker holds for every front: the board's count for the other links, plus
        this link's own in-flight requests (exact here, where the board would lag)."""
        board = self._board
        if board is None:
            return self.in_flight
        return board.others(self.link_id) + self.in_flight

    @property
    def executing(self) -> int:
        # An async execute returns to the worker's loop at once (as Triton's Python backend
        # returns from TRITONBACKEND_ModelInstanceExecute): the instance can take more batches.
        return 0 if self._async_execute else self._executing

    def submit(self, requests: list[InferRequest]) -> None:
        """Write one Execute for `requests` to the worker; each gets its responses through on_response.

        Exception-safe: the batch is encoded and written before anything is counted
        (pending, executing, arena regions, cancel callbacks), so a request that
        cannot be sent is answered with an error and leaves nothing behind. A batch
        copied beside the loop, and those queued behind it, count as executing (and in
        flight) from here; whatever becomes of them, each request is answered.
        """
        if not self.healthy:
            error = KernelError(ErrorCode.INTERNAL, f"Stub process '{self.name}' is not healthy.")
            for r in requests:
                _respond_error(r, error, self.source)
            return
        if self._copying is not None:  # a batch ahead is being copied: these go after it, in order
            self._copying.append(requests)
            self._held_back += len(requests)
            self._executing += 1
            return
        built = self._build(requests)
        if built is None:
            return
        if built.copy_bytes > COPY_BESIDE_BYTES:
            loop = running_loop()
            if loop is not None:
                self._copy_beside(built, loop)
                return
        try:
            void = copy_here(built.copies)
        except Exception as exc:  # noqa: BLE001 - as a failed encoding: undo and answer
            self._unsent(built.requests, built.packed, exc)
            return
        self._send_built(built, void=void)

    def _build(self, requests: list[InferRequest]) -> Optional[Built]:
        """The Execute for `requests`, its large inputs' regions reserved; None when it cannot be
        made (each request then answered with the error, nothing left behind)."""
        batch = []
        keys = []
        packed: list[list] = []  # per request, its inputs as packed so far (arena regions to free on failure)
        traced = None
        trace_key = 0
        arena = self._arena
        in_arena = False  # some input went to the arena: its regions are tracked below
        copies = []
        copy_bytes = 0
        answered: Optional[set] = None  # ids of requests answered here, left out of the batch
        try:
            for request in requests:
                check_correlation_id(request.correlation_id)
                if request.shm is not None:
                    error = window_error(request)
                    if error is not None:  # the client shrank its object: this one is answered, the rest go
                        self._fail_requests((request,), error)
                        answered = answered or set()
                        answered.add(id(request))
                        continue
                key = next(self._keys)
                inputs = []
                packed.append(inputs)
                for t in request.inputs:
                    if t.device is not None:  # a GPU tensor: lent to the worker as its IPC handle, unless
                        # small, for a model taking CPU inputs, and kept mapped here (a client's CUDA
                        # region, a running worker's permanent block): then copied here, as a system
                        # region is read (one small cudaMemcpy; the worker would copy it too, after
                        # one more message each way)
                        if self._cpu_inputs and t.device.nbytes <= wire.INLINE_LIMIT and kept_open(t.device):
                            inputs.append(messages.Tensor(t.name, t.datatype, t.shape, t.device.to_host()))
                        else:
                            inputs.append(self._gpu.lend(t))
                        continue
                    raw = t.raw
                    nbytes = len(raw)
                    if nbytes <= wire.INLINE_LIMIT:  # inline, as wire.pack does, minus its copy: msgspec
                        inputs.append(messages.Tensor(t.name, t.datatype, t.shape, raw))  # encodes any bytes-like
                    else:  # a region now, its bytes once the batch is made (here or beside the loop)
                        segment, offset = arena.alloc(nbytes)
                        inputs.append(messages.Tensor(t.name, t.datatype, list(t.shape), None, segment, offset, nbytes))
                        copies.append((arena.view(segment, offset, nbytes), raw, key))
                        copy_bytes += nbytes
                        in_arena = True
                keys.append(key)
                outputs = [o.name for o in request.outputs] if request.outputs else []
                batch.append(
                    messages.Request(
                        key,
                        request.id,
                        inputs,
                        outputs,
                        request.correlation_id,
                        request.flags,
                        msgspec.json.encode(request.parameters).decode() if request.parameters else "{}",
                        request.arrival_ns,  # then by name: fields with defaults are added over time
                        device_outputs=wire_form(request.device_outputs) if request.device_outputs else False,
                    )
                )
                if self.relay:  # to the supervisor's core: it must know the model and its scheduling asks
                    addressed = batch[-1]
                    addressed.model_name, addressed.model_version = request.model_name, request.model_version
                    addressed.priority, addressed.timeout_us = request.priority, request.timeout_us
                if request.trace is not None:
                    if traced is None:
                        traced = []
                        trace_key = next(self._keys)
                    traced.append(request.trace)
                    batch[-1].trace_context = request.trace.context()  # what request.trace() gives the model
            if not batch:
                return None  # every request was answered: none of their inputs could be read
            execute = messages.Execute(batch, trace_key) if traced else messages.Execute(batch)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, undo and answer every request
            self._unsent(_left(requests, answered), packed, exc)
            return None
        taken = _left(requests, answered)
        return Built(taken, execute, keys, packed, traced, trace_key, in_arena, copies, copy_bytes, arena,
                     self._copy_epoch)

    def _send_built(self, built: Built, counted: bool = False, void: Optional[dict] = None) -> None:
        """Write the Execute, then count its requests as the worker's. counted: the batch is counted
        in `executing` already (it waited for a copy beside the loop). void: keys of requests whose
        shared-memory input was cut short while copied (input_copy.py), with the error they get."""
        if void:  # as if their objects had shrunk before the batch was made: answered, never run
            for request, inputs, error in leave_out(built, void):
                self._give_back(built.arena, [inputs])
                self._fail_requests((request,), error)
            if not built.requests:  # nothing left to send
                if counted:
                    self._executing = max(0, self._executing - 1)
                return
        try:
            self.channel.send(built.execute)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, undo and answer every request
            self._unsent(built.requests, built.packed, exc)
            if counted:
                self._executing = max(0, self._executing - 1)
            return
        # Sent: from here on the worker owns these requests until their final responses.
        in_arena, traced = built.in_arena, built.traced
        for key, request, inputs in zip(built.keys, built.requests, built.packed):
            self._pending[key] = request
            if in_arena:
                regions = wire.arena_regions(inputs)
                if regions:
                    self._input_regions[key] = regions
            request.add_cancel_callback(functools.partial(self._send_cancel, key))
        if traced is not None:
            for trace in traced:
                # Held until this execution's compute times are back (see _on_executions).
                trace.hold()
            self._traced[built.trace_key] = traced
        if not counted:
            self._executing += 1
        self._ages.watch()

    def _copy_beside(self, built: Built, loop: asyncio.AbstractEventLoop) -> None:
        """Fill the batch's regions on a thread; the Execute leaves when they are full. The batch
        counts as executing meanwhile (schedulers see the instance busy), and later batches queue
        behind it."""
        self._executing += 1
        self._held_back += len(built.requests)
        self._copying = collections.deque()
        done = loop.run_in_executor(None, copy_beside, built.copies)
        done.add_done_callback(functools.partial(self._copied, built))

    def _copied(self, built: Built, done: asyncio.Future) -> None:
        if built.epoch is not self._copy_epoch:
            # The worker went while copying (_drop_copying answered the batches behind): answer these,
            # and give their regions back to the arena they are in (a no-op once it is closed).
            self._give_back(built.arena, built.packed)
            self._fail_requests(built.requests,
                                KernelError(ErrorCode.INTERNAL, f"Stub process '{self.name}' is not healthy."))
            return
        self._held_back -= len(built.requests)
        exc = None if done.cancelled() else done.exception()
        if done.cancelled() or exc is not None or not self.healthy:
            self._unsent(built.requests, built.packed, exc if exc is not None else KernelError(
                ErrorCode.INTERNAL, f"Stub process '{self.name}' is not healthy."))
            self._executing = max(0, self._executing - 1)
        else:
            self._send_built(built, counted=True, void=done.result())
        waiting, self._copying = self._copying, None
        while waiting:
            requests = waiting.popleft()
            self._held_back -= len(requests)
            self._executing = max(0, self._executing - 1)  # submit counts it again
            self.submit(requests)
            if self._copying is not None:  # that one is copied beside the loop too: the rest wait behind it
                self._copying.extend(waiting)  # (still counted in _held_back and executing)
                break
        self.notify_available()

    def _drop_copying(self, error: KernelError) -> None:
        """The worker is gone: answer the batches waiting behind a copy; the copy itself is void."""
        self._copy_epoch = object()
        waiting, self._copying = self._copying, None
        self._held_back = 0
        for requests in waiting or ():
            self._fail_requests(requests, error)

    def _unsent(self, requests: list[InferRequest], packed: list[list], exc: Exception) -> None:
        """Undo a batch that never reached the worker and fail each of its requests."""
        self._give_back(self._arena, packed)
        if isinstance(exc, KernelError):
            error = exc
        else:
            log.error("could not send a request to model instance '%s': %s: %s", self.name, type(exc).__name__, exc)
            error = KernelError(
                ErrorCode.INTERNAL,
                f"Failed to send the request(s) to model instance '{self.name}': {type(exc).__name__}: {exc}",
            )
        self._fail_requests(requests, error)
        # No notify_available(): nothing started executing, so what this instance can take is unchanged.

    def _give_back(self, arena, packed: list[list]) -> None:
        """Free the arena regions and GPU loans of requests' inputs that never reached the worker."""
        for inputs in packed:
            for seg, off in wire.arena_regions(inputs):
                arena.free(seg, off)
            self._gpu.returned(t.token for t in inputs if t.ipc is not None)

    def _fail_requests(self, requests, error: KernelError) -> None:
        stats = self.stats
        for request in requests:
            if stats is not None and request.arrival_ns:
                stats.record_failure("BACKEND", time.monotonic_ns() - request.arrival_ns)
            _respond_error(request, error, self.source)

    def _send_cancel(self, key: int) -> None:
        if key in self._pending and self.channel is not None and not self.channel.closed:
            self.channel.send(messages.Cancel(key))
            self._cancelled.cancelled(key)

    def _give_up_cancelled(self, key: int) -> None:
        """Answer a cancelled request the model has been silent on (see cancel_grace.py). Its input
        regions stay with the worker until it gives them back (the model may still hold the arrays);
        a response that still comes for it is dropped, its regions given back (_drop_response)."""
        request = self._pending.pop(key)
        self._input_regions.pop(key, None)
        _respond_error(request, KernelError(ErrorCode.CANCELLED, "Request was cancelled"), self.source)

    # ---- messages from the worker ----------------------------------------

    def _on_message(self, msg) -> None:
        if type(msg) is messages.Responses:
            self._on_responses(msg.responses)
            if msg.executions:
                self._on_executions(msg.executions)
            if msg.releases:  # after the responses: an output may be a view of a released input
                self._views.free_inputs(msg.releases)
        elif type(msg) is messages.SegmentAdded:
            self._peer.receive(self._fd_sock, msg.segment, msg.size)
        elif type(msg) is messages.SegmentRemoved:
            self._peer.remove(msg.segment)
        elif type(msg) is messages.DeviceRelease:
            self._gpu.returned(msg.tokens)
        elif type(msg) is messages.Release:
            # The worker's last array over these (inputs, BLS outputs) is gone: free them, or leave
            # that to the last response view that still shows one.
            self._views.free_inputs(msg.regions)
        elif type(msg) is messages.ReadyResult:
            fut = self._ready_checks.pop(msg.key, None)
            if fut is not None and not fut.done():
                fut.set_result((msg.ready, msg.reason))
        elif type(msg) is messages.Board:
            _, fds, _, _ = socket.recv_fds(self._fd_sock, 1, 1)
            if self._board is not None:
                self._board.close()
            self._board = BoardView(fds[0], msg.size)
        elif type(msg) is messages.Gather:
            # The worker has another front's batch waiting, with room: what this front's scheduler
            # queued goes now (its Execute first, then the answer, in this order on the link).
            hook = self.on_gather
            if hook is not None:
                hook(self, msg.room)
            try:
                self.channel.send(messages.Gathered(msg.round))
            except ConnectionError:
                pass  # (the worker is gone: its loss is handled where the channel closes)
        elif type(msg) is messages.UsageReport:
            fut = self._ready_checks.get(msg.key)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        else:
            self._on_worker_message(msg)

    def _on_worker_message(self, msg) -> None:
        """Messages of the primary link only (WorkerInstance)."""

    def _on_responses(self, responses: list[messages.Response]) -> None:
        source = self.source
        version = str(source.version)
        views = self._views
        cancelled = self._cancelled.since
        for r in responses:
            request = self._pending.get(r.key)
            if request is None:
                self._drop_response(r)
                continue
            if r.final:
                del self._pending[r.key]
                regions = self._input_regions.pop(r.key, None)
            else:
                regions = self._input_regions.get(r.key)
                self._ages.progressed(r.key)
            if cancelled:
                self._cancelled.answered(r.key, r.final)
            error = KernelError(ErrorCode[r.error.code], r.error.message) if r.error is not None else None
            if r.reschedule:
                self._reschedule(request)
                continue
            if error is None:
                try:  # views of the arenas, not copies: an output may be a view of these very inputs
                    outputs = [InferTensor(t.name, t.datatype, t.shape, raw=t.data) if t.data is not None
                               else views.unpack(t, regions) if t.ipc is None else self._gpu.unpack(t) for t in r.outputs]
                except ValueError as exc:
                    error = KernelError(ErrorCode.INTERNAL, f"the model's worker sent a bad tensor location: {exc}")
            name = request.model_name if self.relay else source.name  # (a relay serves many models)
            if self.relay:
                version = request.model_version
            if error is not None:
                response = InferResponse(name, version, request.id, error=error, final=r.final)
            else:
                params = msgspec.json.decode(r.parameters) if r.parameters else None
                response = InferResponse(name, version, request.id, outputs, params, final=r.final)
            try:
                request.on_response(response)
            except Exception:  # a transport callback must never break the channel
                log.exception("response callback failed for model '%s'", source.name)

    # ---- schedulers and statistics: finished executions, rescheduled requests ----

    def _on_executions(self, executions: list[messages.Execution]) -> None:
        self._executing = max(0, self._executing - len(executions))
        stats = self.stats
        if stats is not None:
            for e in executions:
                stats.record_execution(e)
        for e in executions:
            if e.trace_key:
                self._end_traces(self._traced.pop(e.trace_key, ()), e)
        self.notify_available()

    @staticmethod
    def _end_traces(traces, e=None) -> None:
        """Stamp the compute phases of an execution (if it ran) into its traced requests' traces."""
        end = time.monotonic_ns()
        for trace in traces:
            if e is not None:
                trace.stamp("COMPUTE_START", e.start)
                trace.stamp("COMPUTE_INPUT_END", e.input_end)
                trace.stamp("COMPUTE_OUTPUT_START", e.output_start)
                trace.stamp("COMPUTE_END", e.end)
            trace.stamp("REQUEST_END", end)
            trace.release()

    def _reschedule(self, request: InferRequest) -> None:
        """The model released the request with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE."""
        if request.on_reschedule is not None:
            request.on_reschedule(request)
            return
        _respond_error(request, KernelError(
            ErrorCode.INVALID_ARG,
            "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
            "configured to handle such a flag.",
        ), self.source)

    def _drop_response(self, r: messages.Response) -> None:
        """A response for a request no longer pending here (answered as cancelled): give back the
        worker's arena regions its outputs were copied into."""
        regions = [(t.segment, t.offset) for t in r.outputs if t.data is None and t.owner < 0 and t.ipc is None]
        if regions:
            self._send_release(regions)
        self._gpu.release_now(t.token for t in r.outputs if t.ipc is not None)

    def _send_segment_removed(self, index: int) -> None:
        if self.channel is not None and not self.channel.closed:
            self.channel.send(messages.SegmentRemoved(index))

    def _send_release(self, regions: list) -> None:
        """The last view of these regions of the worker's arena is gone (see arena_views.py)."""
        if self.channel is not None:
            self.channel.send(messages.Release(regions))

    def _fail_pending(self, message: str, framed: bool = True) -> None:
        error = KernelError(
            ErrorCode.INTERNAL,
            f"Failed to process the request(s) for model '{self.name}', message: {message}" if framed else message,
        )
        if self._copying is not None:
            self._drop_copying(error)
        pending, self._pending = self._pending, {}
        self._gpu.close(f"its process exited ({message})")
        self._input_regions.clear()
        self._cancelled.close()
        traced, self._traced = self._traced, {}
        for traces in traced.values():
            self._end_traces(traces)
        self._fail_requests(pending.values(), error)
        self._executing = 0
        self.notify_available()

    def _announce_segment(self, index: int, segment) -> None:
        socket.send_fds(self._fd_sock, [b"\0"], [segment.fd])
        self.channel.send(messages.SegmentAdded(index, segment.size))


def _left(requests: list, answered: Optional[set]) -> list:
    return requests if not answered else [r for r in requests if id(r) not in answered]


def _respond_error(request: InferRequest, error: KernelError, source) -> None:
    if request.on_response is not None:
        request.on_response(InferResponse(source.name, str(source.version), request.id, error=error))
