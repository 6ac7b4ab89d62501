"""The front-process side of one model instance: a worker process and its channel.

Requests are encoded straight onto the worker's socket (no queue in between, so an idle worker
never waits on us); responses come back on it and go to each request's `on_response` on the loop.

A request's large inputs are copied once into this side's arena; each region is freed when the
worker gives it back (Release: the model's last array over it is gone) and no response view
still shows it. A cancelled request the model stays silent on is answered here after a grace
period (cancel_grace.py), so it holds neither its client, nor the pending count, nor shutdown.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import socket
import time
from pathlib import Path
from typing import Optional

import msgspec

from kernel.backends.python import messages, standby, wire
from kernel.backends.python.age_watch import AgeWatch
from kernel.backends.python.arena import Arena, PeerArena
from kernel.backends.python.arena_trim import DEFAULT_IDLE_SECONDS, IdleTrim
from kernel.backends.python.arena_views import ArenaViews
from kernel.backends.python.cancel_grace import CancelGrace
from kernel.backends.python.execenv import WorkerCommand, server_command
from kernel.backends.python.framing import MessageChannel
from kernel.backends.python.front_calls import FrontCalls
from kernel.backends.python.gpu_front import DeviceTensors
from kernel.backends.python.metrics_client import handle_ops as _handle_metric_ops
from kernel.core.backend import BackendInstance, CoreHandle, ModelSource
from kernel.core.device_memory import wire_form
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor, check_correlation_id

log = logging.getLogger("kernel.python")


class WorkerSettings(msgspec.Struct, frozen=True):
    shm_default_byte_size: int = 64 * 1024 * 1024
    shm_growth_byte_size: int = 64 * 1024 * 1024
    stub_timeout_seconds: float = 30.0
    is_ready_timeout_seconds: float = 5.0
    log: messages.LogSettings = messages.LogSettings()
    # Kernel only: a request unanswered this long is logged once (age_watch.py); 0 turns it off.
    request_age_warning_seconds: float = 60.0
    # Kernel only: a grown arena segment wholly free this long is given back (arena_trim.py); 0: never.
    shm_idle_release_seconds: float = DEFAULT_IDLE_SECONDS


# How long a worker stuck in an execute() for requests all given up on may take to exit (see stop).
STUCK_EXIT_S = 1.0


class WorkerInstance(FrontCalls, BackendInstance):
    def __init__(
        self,
        source: ModelSource,
        name: str,
        kind: str,
        device_id: int,
        settings: WorkerSettings,
        core: Optional[CoreHandle] = None,
    ):
        self.source = source
        self.core = core
        self.name = name
        self.kind = kind
        self.device_id = device_id
        self.settings = settings
        self.healthy = False
        self._stopping = False
        self._starting = False  # start() has not succeeded yet: a worker that exits meanwhile is its to replace
        self.on_unexpected_exit = None  # set by the backend: the restart policy lives there
        # Set by the backend: the interpreter/environment (execenv.py) and the model file to run.
        self.command: Optional[WorkerCommand] = None
        self.model_file: Path = source.version_dir / self._model_filename()
        self._reset()

    def _reset(self) -> None:
        """Fresh per-process state: a restarted worker starts from here."""
        self.process: Optional[asyncio.subprocess.Process] = None
        self.channel: Optional[MessageChannel] = None
        self._fd_sock: Optional[socket.socket] = None
        self._arena = Arena(
            self.settings.shm_default_byte_size, self.settings.shm_growth_byte_size, f"kernel-{self.name}"
        )
        self._arena.on_new_segment = self._announce_segment
        self._peer = PeerArena()
        self._views = ArenaViews(self._arena, self._peer, self._send_release)  # outputs: views, no copy
        self._gpu = DeviceTensors(self)  # GPU tensors as CUDA IPC handles (gpu_front.py)
        self._trim: Optional[IdleTrim] = None  # made with the loop, at start
        self._pending: dict[int, InferRequest] = {}
        if getattr(self, "_cancelled", None) is not None:
            self._cancelled.close()
        self._cancelled = CancelGrace(lambda: self._pending, self._give_up_cancelled)
        self._input_regions: dict[int, list[tuple[int, int]]] = {}
        self._bls_calls: dict[int, InferRequest] = {}
        self._keys = itertools.count(1)
        self._started: Optional[asyncio.Future] = None
        self._ready: Optional[asyncio.Future] = None
        self._exited: Optional[asyncio.Future] = None
        self._has_is_ready = False
        self._ready_checks: dict[int, asyncio.Future] = {}
        self._executing = 0  # Execute messages whose execute() has not finished (schedulers, statistics)
        self._traced: dict[int, list] = {}  # Execute trace_key -> kernel.observe.trace.Trace of its traced requests
        if getattr(self, "_ages", None) is not None:
            self._ages.close()
        self._ages = AgeWatch(self.name, self.settings.request_age_warning_seconds, lambda: self._pending)
        self._async_execute = False

    # ---- lifecycle -----------------------------------------------------

    async def restart(self) -> None:
        self._release_resources()
        self._reset()
        await self.start()

    async def start(self) -> None:
        self._starting = True
        loop = asyncio.get_running_loop()
        command = self.command or server_command()
        args = [
            "--model-file", str(self.model_file), "--instance-name", self.name,
            "--shm-default-byte-size", str(self.settings.shm_default_byte_size),
            "--shm-growth-byte-size", str(self.settings.shm_growth_byte_size),
            "--shm-idle-release-seconds", str(self.settings.shm_idle_release_seconds),
        ]  # fmt: skip
        self._trim = IdleTrim(self._arena, loop, self.settings.shm_idle_release_seconds, self._send_segment_removed)
        timeout = self.settings.stub_timeout_seconds
        if await self._launch(command, args, standby_ok=True):
            # A standby has done its imports: it reports in at once, unless it cannot (stopped or
            # killed after it was taken). Then a fresh worker, with the whole stub timeout.
            started, ready = self._started, self._ready
            await standby.wait_for_report(self.process, (started, ready), min(timeout, standby.REPORT_S))
            if not started.done():
                log.warning("standby worker %s for model instance '%s' did not report in (%s); starting a fresh worker",
                            self.process.pid, self.name, ready.result() if ready.done() else "no answer")
                self._give_up_launch()
                await self._launch(command, args, standby_ok=False)
        # stub-timeout-seconds bounds the worker's start (Started, or an early Ready/exit), as
        # Triton bounds its stub's; the model's initialize() then takes as long as it takes.
        started, ready = self._started, self._ready
        if not started.done():
            await asyncio.wait((started, ready), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if ready.done() or started.done():
            error = await asyncio.shield(ready)
        else:
            self._kill()
            raise KernelError(
                ErrorCode.INTERNAL,
                f"Timed out occurred while waiting for the stub process '{self.name}' to become ready "
                f"(stub-timeout-seconds={self.settings.stub_timeout_seconds:g})",
            ) from None
        if error is not None:
            self._kill()
            raise KernelError(ErrorCode.INTERNAL, error)
        self.healthy = True
        self._starting = False
        self.notify_available()
        log.info("TRITONBACKEND_ModelInstanceInitialize: %s (%s device %d)", self.name, self.kind[5:], self.device_id)

    async def _launch(self, command, args: list[str], standby_ok: bool) -> bool:
        """Start (or take) a worker process, connect, send Initialize; True when it is a standby."""
        loop = asyncio.get_running_loop()
        self.process, front, fd_front, from_standby = await standby.start_worker(command, args, standby_ok)
        self._fd_sock = fd_front
        self._started = loop.create_future()
        self._ready = loop.create_future()
        self._exited = loop.create_future()
        _, self.channel = await loop.create_unix_connection(
            lambda: MessageChannel(messages.ToFront, self._on_message, self._on_lost), sock=front
        )
        asyncio.ensure_future(self._watch_process(self.process))
        self.channel.send(messages.Initialize(self._initialize_args(), self.settings.log))
        return from_standby

    def _give_up_launch(self) -> None:
        """Let go of a worker that never reported in: killed, its channels closed; not this instance's any more."""
        process, self.process = self.process, None
        if process is not None:
            standby.kill(process)  # (its _watch_process reaps it)
        if self.channel is not None and self.channel.transport is not None:
            self.channel.transport.close()
        if self._fd_sock is not None:
            self._fd_sock.close()
            self._fd_sock = None

    def _model_filename(self) -> str:
        return self.source.config.default_model_filename or "model.py"

    def _initialize_args(self) -> dict[str, str]:
        return {
            "model_config": self.source.config_json,
            "model_instance_kind": self.kind.removeprefix("KIND_"),  # Triton's "CPU" / "GPU" / "MODEL"
            "model_instance_name": self.name,
            "model_instance_device_id": str(self.device_id),
            "model_repository": str(self.source.model_dir),
            "model_version": str(self.source.version),
            "model_name": self.source.name,
        }

    async def _watch_process(self, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if self.process is not process:
            return  # a worker given up at start-up, or one a restart replaced: its state is gone already
        self.healthy = False
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(
                f"Stub process '{self.name}' exited with code {code} before the model finished initializing"
            )
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(code)
        self._fail_pending(f"Stub process '{self.name}' is not healthy.", framed=False)  # Triton's words, alone
        if not self._stopping:
            log.error("Stub process '%s' is not healthy: it exited unexpectedly with code %s", self.name, code)
            # (During start(), start() itself replaces a standby that dies, or fails the load.)
            if self.on_unexpected_exit is not None and not self._starting:
                self.on_unexpected_exit(self)

    def _kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass

    async def stop(self, timeout: float) -> None:
        self._stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._pending and loop.time() < deadline and self.healthy:
            await asyncio.sleep(0.01)
        if self.healthy and self.channel is not None and not self.channel.closed:
            wait = max(0.5, deadline - loop.time())
            if self._executing and not self._pending and not self._async_execute:
                # Still inside execute() for requests all given up on (cancelled, never answered):
                # a synchronous model's finalize() cannot run before that execute returns, which it
                # may never do. Not worth the whole exit timeout.
                wait = min(wait, STUCK_EXIT_S)
            try:
                self.channel.send(messages.Shutdown())
                await asyncio.wait_for(asyncio.shield(self._exited), wait)
            except (asyncio.TimeoutError, ConnectionError):
                pass
        self._kill()
        if self._exited is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._exited), 5)
            except asyncio.TimeoutError:
                pass
        self.healthy = False
        self._fail_pending(f"Stub process '{self.name}' was stopped.")
        self._release_resources()

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
        check = next(iter(self._ready_checks.values()), None)
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

    # ---- request path ----------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def executing(self) -> int:
        # An async execute returns to the worker's loop at once (as Triton's Python backend
        # returns from TRITONBACKEND_ModelInstanceExecute): the instance can take more batches.
        return 0 if self._async_execute else self._executing

    def submit(self, requests: list[InferRequest]) -> None:
        """Write one Execute for `requests` to the worker; each gets its responses through on_response.

        Exception-safe: the batch is encoded and written before anything is counted
        (pending, executing, arena regions, cancel callbacks), so a request that
        cannot be sent is answered with an error and leaves nothing behind.
        """
        if not self.healthy:
            error = KernelError(ErrorCode.INTERNAL, f"Stub process '{self.name}' is not healthy.")
            for r in requests:
                _respond_error(r, error, self.source)
            return
        batch = []
        keys = []
        packed: list[list] = []  # per request, its inputs as packed so far (arena regions to free on failure)
        traced = None
        trace_key = 0
        arena = self._arena
        in_arena = False  # some input went to the arena: its regions are tracked below
        try:
            for request in requests:
                check_correlation_id(request.correlation_id)
                inputs = []
                packed.append(inputs)
                for t in request.inputs:
                    if t.device is not None:  # a GPU tensor: lent to the worker as its IPC handle
                        inputs.append(self._gpu.lend(t))
                        continue
                    raw = t.raw
                    if len(raw) <= wire.INLINE_LIMIT:  # inline, as wire.pack does, minus its copy: msgspec
                        inputs.append(messages.Tensor(t.name, t.datatype, t.shape, raw))  # encodes any bytes-like
                    else:
                        inputs.append(wire.pack(t.name, t.datatype, t.shape, raw, arena))
                        in_arena = True
                key = next(self._keys)
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
                if request.trace is not None:
                    if traced is None:
                        traced = []
                        trace_key = next(self._keys)
                    traced.append(request.trace)
                    batch[-1].trace_context = request.trace.context()  # what request.trace() gives the model
            self.channel.send(messages.Execute(batch, trace_key) if traced else messages.Execute(batch))
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, undo and answer every request
            self._unsent(requests, packed, exc)
            return
        # Sent: from here on the worker owns these requests until their final responses.
        for key, request, inputs in zip(keys, requests, packed):
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
            self._traced[trace_key] = traced
        self._executing += 1
        self._ages.watch()

    def _unsent(self, requests: list[InferRequest], packed: list[list], exc: Exception) -> None:
        """Undo a batch that never reached the worker and fail each of its requests."""
        for inputs in packed:
            for seg, off in wire.arena_regions(inputs):
                self._arena.free(seg, off)
            self._gpu.returned(t.token for t in inputs if t.ipc is not None)
        if isinstance(exc, KernelError):
            error = exc
        else:
            log.error("could not send a request to model instance '%s': %s: %s", self.name, type(exc).__name__, exc)
            error = KernelError(
                ErrorCode.INTERNAL,
                f"Failed to send the request(s) to model instance '{self.name}': {type(exc).__name__}: {exc}",
            )
        stats = self.stats
        for request in requests:
            if stats is not None and request.arrival_ns:
                stats.record_failure("BACKEND", time.monotonic_ns() - request.arrival_ns)
            _respond_error(request, error, self.source)
        # No notify_available(): nothing started executing, so what this instance can take is unchanged.

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
        elif type(msg) is messages.MetricOps:
            _handle_metric_ops(self, self.core.custom_metrics if self.core is not None else None, msg.ops)
        elif type(msg) is messages.SegmentAdded:
            _, fds, _, _ = socket.recv_fds(self._fd_sock, 1, 1)
            self._peer.add(msg.segment, fds[0], msg.size)
        elif type(msg) is messages.SegmentRemoved:
            self._peer.remove(msg.segment)
        elif type(msg) is messages.DeviceRelease:
            self._gpu.returned(msg.tokens)
        elif type(msg) is messages.BlsRequest:
            self._on_bls_request(msg)
        elif type(msg) is messages.ModelControl:
            asyncio.ensure_future(self._on_model_control(msg))
        elif type(msg) is messages.BlsCancel:
            request = self._bls_calls.get(msg.key)
            if request is not None:
                request.cancel()
        elif type(msg) is messages.Release:
            # The worker's last array over these (inputs, BLS outputs) is gone: free them, or leave
            # that to the last response view that still shows one.
            self._views.free_inputs(msg.regions)
        elif type(msg) is messages.ReadyResult:
            fut = self._ready_checks.pop(msg.key, None)
            if fut is not None and not fut.done():
                fut.set_result((msg.ready, msg.reason))
        elif type(msg) is messages.Started:
            if self._started is not None and not self._started.done():
                self._started.set_result(None)
        elif type(msg) is messages.Ready:
            self._has_is_ready = msg.has_is_ready
            self._async_execute = msg.async_execute
            if not self._ready.done():
                self._ready.set_result(msg.error)
        elif type(msg) is messages.Finalized:
            if msg.error:
                log.error("finalize of '%s' failed: %s", self.name, msg.error)

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
            if error is not None:
                response = InferResponse(source.name, version, request.id, error=error, final=r.final)
            else:
                params = msgspec.json.decode(r.parameters) if r.parameters else None
                response = InferResponse(source.name, version, request.id, outputs, params, final=r.final)
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

    def update_log_settings(self, log_settings: messages.LogSettings) -> None:
        """New server log settings: this worker applies them at once, a restarted one from the start."""
        self.settings = msgspec.structs.replace(self.settings, log=log_settings)
        if self.channel is not None and not self.channel.closed:
            try:
                self.channel.send(messages.SetLog(log_settings))
            except ConnectionError:
                pass

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

    def _on_lost(self, exc) -> None:
        self.healthy = False

    def _fail_pending(self, message: str, framed: bool = True) -> None:
        calls, self._bls_calls = self._bls_calls, {}
        for request in calls.values():
            request.cancel()
        pending, self._pending = self._pending, {}
        self._gpu.close(f"its process exited ({message})")
        self._input_regions.clear()
        self._cancelled.close()
        traced, self._traced = self._traced, {}
        for traces in traced.values():
            self._end_traces(traces)
        error = KernelError(
            ErrorCode.INTERNAL,
            f"Failed to process the request(s) for model '{self.name}', message: {message}" if framed else message,
        )
        stats = self.stats
        for request in pending.values():
            if stats is not None and request.arrival_ns:
                stats.record_failure("BACKEND", time.monotonic_ns() - request.arrival_ns)
            _respond_error(request, error, self.source)
        metrics = self.core.custom_metrics if self.core is not None else None
        if metrics is not None:
            metrics.drop_owner(self)
        self._executing = 0
        self.notify_available()

    def _announce_segment(self, index: int, segment) -> None:
        socket.send_fds(self._fd_sock, [b"\0"], [segment.fd])
        self.channel.send(messages.SegmentAdded(index, segment.size))


def _respond_error(request: InferRequest, error: KernelError, source: ModelSource) -> None:
    if request.on_response is not None:
        request.on_response(InferResponse(source.name, str(source.version), request.id, error=error))
