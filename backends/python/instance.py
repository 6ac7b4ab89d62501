"""The front-process side of one model instance: a worker process and its channel.

Requests are encoded straight onto the worker's socket (no queue in between,
so an idle worker never waits on us); responses come back on the same socket
and are handed to each request's `on_response` on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

import msgspec

from backends.python import messages, wire
from backends.python.arena import Arena, PeerArena
from backends.python.framing import MessageChannel
from kernel.backend import BackendInstance, ModelSource
from kernel.errors import ErrorCode, KernelError
from kernel.request import InferRequest, InferResponse, InferTensor

log = logging.getLogger("kernel.python")

_REPO_ROOT = str(Path(__file__).resolve().parents[2])


class WorkerSettings(msgspec.Struct, frozen=True):
    shm_default_byte_size: int = 64 * 1024 * 1024
    shm_growth_byte_size: int = 64 * 1024 * 1024
    stub_timeout_seconds: float = 30.0
    log_verbose: int = 0


class WorkerInstance(BackendInstance):
    def __init__(self, source: ModelSource, name: str, kind: str, device_id: int, settings: WorkerSettings):
        self.source = source
        self.name = name
        self.kind = kind
        self.device_id = device_id
        self.settings = settings
        self.healthy = False
        self._stopping = False
        self.on_unexpected_exit = None  # set by the backend: the restart policy lives there
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
        self._pending: dict[int, InferRequest] = {}
        self._input_regions: dict[int, list[tuple[int, int]]] = {}
        self._keys = itertools.count(1)
        self._ready: Optional[asyncio.Future] = None
        self._exited: Optional[asyncio.Future] = None

    # ---- lifecycle -----------------------------------------------------

    async def restart(self) -> None:
        self._release_resources()
        self._reset()
        await self.start()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        front, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fd_front, fd_worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_REPO_ROOT, env.get("PYTHONPATH", "")) if p
        )
        cmd = [
            sys.executable,
            "-m",
            "backends.python.worker",
            "--channel-fd",
            str(worker.fileno()),
            "--fd-channel-fd",
            str(fd_worker.fileno()),
            "--model-file",
            str(self.source.version_dir / self._model_filename()),
            "--instance-name",
            self.name,
            "--shm-default-byte-size",
            str(self.settings.shm_default_byte_size),
            "--shm-growth-byte-size",
            str(self.settings.shm_growth_byte_size),
        ]
        self.process = await asyncio.create_subprocess_exec(
            *cmd, pass_fds=(worker.fileno(), fd_worker.fileno()), env=env
        )
        worker.close()
        fd_worker.close()
        self._fd_sock = fd_front
        self._ready = loop.create_future()
        self._exited = loop.create_future()
        _, self.channel = await loop.create_unix_connection(
            lambda: MessageChannel(messages.ToFront, self._on_message, self._on_lost), sock=front
        )
        asyncio.ensure_future(self._watch_process(self.process))
        self.channel.send(messages.Initialize(self._initialize_args(), self.settings.log_verbose))
        try:
            error = await asyncio.wait_for(asyncio.shield(self._ready), self.settings.stub_timeout_seconds)
        except asyncio.TimeoutError:
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

    def _model_filename(self) -> str:
        return self.source.config.default_model_filename or "model.py"

    def _initialize_args(self) -> dict[str, str]:
        return {
            "model_config": self.source.config_json,
            "model_instance_kind": self.kind,
            "model_instance_name": self.name,
            "model_instance_device_id": str(self.device_id),
            "model_repository": str(self.source.model_dir),
            "model_version": str(self.source.version),
            "model_name": self.source.name,
        }

    async def _watch_process(self, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        self.healthy = False
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(
                f"Stub process '{self.name}' exited with code {code} before the model finished initializing"
            )
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(code)
        if self.process is not process:
            return
        self._fail_pending(f"Stub process '{self.name}' is not healthy.")
        if not self._stopping:
            log.error("Stub process '%s' exited unexpectedly with code %s", self.name, code)
            if self.on_unexpected_exit is not None:
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
            try:
                self.channel.send(messages.Shutdown())
                await asyncio.wait_for(asyncio.shield(self._exited), max(0.5, deadline - loop.time()))
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
        self._arena.close()
        self._peer.close()
        if self._fd_sock is not None:
            self._fd_sock.close()
            self._fd_sock = None
        if self.channel is not None and self.channel.transport is not None:
            self.channel.transport.close()

    # ---- request path ----------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def submit(self, requests: list[InferRequest]) -> None:
        if not self.healthy:
            error = KernelError(ErrorCode.INTERNAL, f"Stub process '{self.name}' is not healthy.")
            for r in requests:
                _respond_error(r, error, self.source)
            return
        batch = []
        for request in requests:
            key = next(self._keys)
            inputs = []
            for t in request.inputs:
                inputs.append(wire.pack(t.name, t.datatype, t.shape, t.raw, self._arena))
            regions = wire.arena_regions(inputs)
            if regions:
                self._input_regions[key] = regions
            self._pending[key] = request
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
                )
            )
            request.add_cancel_callback(functools.partial(self._send_cancel, key))
        self.channel.send(messages.Execute(batch))

    def _send_cancel(self, key: int) -> None:
        if key in self._pending and self.channel is not None and not self.channel.closed:
            self.channel.send(messages.Cancel(key))

    # ---- messages from the worker ----------------------------------------

    def _on_message(self, msg) -> None:
        if type(msg) is messages.Responses:
            self._on_responses(msg.responses)
        elif type(msg) is messages.SegmentAdded:
            _, fds, _, _ = socket.recv_fds(self._fd_sock, 1, 1)
            self._peer.add(msg.segment, fds[0], msg.size)
        elif type(msg) is messages.Ready:
            if not self._ready.done():
                self._ready.set_result(msg.error)
        elif type(msg) is messages.Finalized:
            if msg.error:
                log.error("finalize of '%s' failed: %s", self.name, msg.error)

    def _on_responses(self, responses: list[messages.Response]) -> None:
        source = self.source
        version = str(source.version)
        release = []
        for r in responses:
            request = self._pending.get(r.key)
            if request is None:
                continue
            if r.final:
                del self._pending[r.key]
                for seg, off in self._input_regions.pop(r.key, ()):
                    self._arena.free(seg, off)
            if r.error is not None:
                response = InferResponse(
                    source.name, version, request.id,
                    error=KernelError(ErrorCode[r.error.code], r.error.message), final=r.final,
                )
            else:
                outputs = []
                for t in r.outputs:
                    if t.data is not None:
                        outputs.append(InferTensor(t.name, t.datatype, t.shape, raw=t.data))
                    else:
                        # one copy out of the arena, so the region can be reused at once
                        outputs.append(
                            InferTensor(t.name, t.datatype, t.shape, raw=bytes(self._peer.view(t.segment, t.offset, t.nbytes)))
                        )
                        release.append((t.segment, t.offset))
                params = msgspec.json.decode(r.parameters) if r.parameters else None
                response = InferResponse(source.name, version, request.id, outputs, params, final=r.final)
            try:
                request.on_response(response)
            except Exception:  # a transport callback must never break the channel
                log.exception("response callback failed for model '%s'", source.name)
        if release:
            self.channel.send(messages.Release(release))

    def _on_lost(self, exc) -> None:
        self.healthy = False

    def _fail_pending(self, message: str) -> None:
        pending, self._pending = self._pending, {}
        self._input_regions.clear()
        error = KernelError(
            ErrorCode.INTERNAL,
            f"Failed to process the request(s) for model instance '{self.name}', message: {message}",
        )
        for request in pending.values():
            _respond_error(request, error, self.source)

    def _announce_segment(self, index: int, segment) -> None:
        socket.send_fds(self._fd_sock, [b"\0"], [segment.fd])
        self.channel.send(messages.SegmentAdded(index, segment.size))


def _respond_error(request: InferRequest, error: KernelError, source: ModelSource) -> None:
    if request.on_response is not None:
        request.on_response(InferResponse(source.name, str(source.version), request.id, error=error))
