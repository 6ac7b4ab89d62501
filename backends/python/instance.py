"""The front-process side of one model instance: a worker process and its primary link.

The request path over the link (requests, responses, executions, arenas, cancellation) is
request_path.py; this adds the process: starting it (or taking a standby), Initialize, restarts
(the backend's policy), stopping, readiness, and what only the primary link carries: BLS calls and
the model loading API (front_calls.py), custom metrics, log settings. Other front processes reach
the same worker over links of their own (`open_link`, link.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from typing import Optional

import msgspec

from kernel.backends.python import messages, standby
from kernel.backends.python.arena_trim import DEFAULT_IDLE_SECONDS
from kernel.backends.python.execenv import WorkerCommand, server_command
from kernel.backends.python.framing import MessageChannel
from kernel.backends.python.front_calls import FrontCalls
from kernel.backends.python.metrics_client import handle_ops as _handle_metric_ops
from kernel.backends.python.request_path import RequestPath
from kernel.core.backend import CoreHandle, ModelSource
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest

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


class WorkerFacts(msgspec.Struct, frozen=True):
    """What a front process needs to know of a worker to serve it over a link (the supervisor sends
    it with the link's sockets: WorkerInstance.facts(), then LinkedInstance)."""

    name: str
    kind: str
    device_id: int
    pid: int
    async_execute: bool = False
    has_is_ready: bool = False
    decoupled: bool = False


class WorkerInstance(FrontCalls, RequestPath):
    def __init__(
        self,
        source: ModelSource,
        name: str,
        kind: str,
        device_id: int,
        settings: WorkerSettings,
        core: Optional[CoreHandle] = None,
    ):
        self._init_path(source, name, kind, device_id, settings, core)
        self._starting = False  # start() has not succeeded yet: a worker that exits meanwhile is its to replace
        self.on_unexpected_exit = None  # set by the backend: the restart policy lives there
        # Set by the backend: the interpreter/environment (execenv.py) and the model file to run.
        self.command: Optional[WorkerCommand] = None
        self.model_file: Path = source.version_dir / self._model_filename()
        self._reset()

    def _reset(self) -> None:
        """Fresh per-process state: a restarted worker starts from here."""
        self._reset_path()
        self.process: Optional[asyncio.subprocess.Process] = None
        self._bls_calls: dict[int, InferRequest] = {}
        self._started: Optional[asyncio.Future] = None
        self._ready: Optional[asyncio.Future] = None
        self._exited: Optional[asyncio.Future] = None
        self._decoupled = False
        self._links: set[int] = set()  # link ids opened to this worker (open_link)

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
        self._start_trim(loop)
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
        while self.in_flight and loop.time() < deadline and self.healthy:  # (sent, or being copied)
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

    # ---- links: other front processes served by this worker ----------------

    def open_link(self, link_id: int) -> tuple[socket.socket, socket.socket]:
        """A new link to this worker for another front process: (its channel socket, its fd socket).

        Synchronous: the worker gets its ends now (LinkAdded on the primary channel, the two sockets
        on the primary fd channel) and serves the link once it reads them. link_id (1..254) is
        unique per worker; opening one again replaces the link the worker had under that id.
        Raises KernelError (UNAVAILABLE) when the worker is not healthy.
        """
        if not 1 <= link_id <= 254:
            raise ValueError(f"link id {link_id} is not in 1..254")
        if not self.healthy or self.channel is None or self.channel.closed:
            raise KernelError(ErrorCode.UNAVAILABLE, f"Stub process '{self.name}' is not healthy.")
        with standby.socket_pairs() as (front, worker, fd_front, fd_worker):
            socket.send_fds(self._fd_sock, [b"\0"], [worker.fileno(), fd_worker.fileno()])
            self.channel.send(messages.LinkAdded(link_id))
        self._links.add(link_id)
        return front, fd_front

    def facts(self) -> WorkerFacts:
        """What a LinkedInstance needs to know of this worker (valid once started)."""
        return WorkerFacts(self.name, self.kind, self.device_id, self.process.pid if self.process else 0,
                           self._async_execute, self._has_is_ready, self._decoupled)

    @property
    def shared(self) -> bool:
        return bool(self._links)

    def update_log_settings(self, log_settings: messages.LogSettings) -> None:
        """New server log settings: this worker applies them at once, a restarted one from the start."""
        self.settings = msgspec.structs.replace(self.settings, log=log_settings)
        if self.channel is not None and not self.channel.closed:
            try:
                self.channel.send(messages.SetLog(log_settings))
            except ConnectionError:
                pass

    def _on_worker_message(self, msg) -> None:
        if type(msg) is messages.MetricOps:
            _handle_metric_ops(self, self.core.custom_metrics if self.core is not None else None, msg.ops)
        elif type(msg) is messages.BlsRequest:
            self._on_bls_request(msg)
        elif type(msg) is messages.ModelControl:
            asyncio.ensure_future(self._on_model_control(msg))
        elif type(msg) is messages.BlsCancel:
            request = self._bls_calls.get(msg.key)
            if request is not None:
                request.cancel()
        elif type(msg) is messages.Started:
            if self._started is not None and not self._started.done():
                self._started.set_result(None)
        elif type(msg) is messages.Ready:
            self._has_is_ready = msg.has_is_ready
            self._async_execute = msg.async_execute
            self._decoupled = msg.decoupled
            if not self._ready.done():
                self._ready.set_result(msg.error)
        elif type(msg) is messages.Finalized:
            if msg.error:
                log.error("finalize of '%s' failed: %s", self.name, msg.error)

    def _on_lost(self, exc) -> None:
        self.healthy = False

    def _fail_pending(self, message: str, framed: bool = True) -> None:
        calls, self._bls_calls = self._bls_calls, {}
        for request in calls.values():
            request.cancel()
        metrics = self.core.custom_metrics if self.core is not None else None
        if metrics is not None:
            metrics.drop_owner(self)
        super()._fail_pending(message, framed)
