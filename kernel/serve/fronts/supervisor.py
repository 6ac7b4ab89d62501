"""The supervisor of several front processes: starts them, replaces one that dies, stops them first.

`kernel serve --front-processes N` (N >= 2) runs here: the process that loaded the models (every
worker is its child) runs no client transport itself; it holds each client port with a socket
that never listens (kernel.transports.listen.reserve) and starts N fronts that bind beside it.
Start-up: the fronts start at once (liveness answers while models load, readiness is false),
the models load, every front gets them (hub.py), then every front starts the transports that
waited for the models and the server is ready once all have. A front that exits on its own (a
crash, a SIGKILL, a SIGTERM sent to it alone) is started again with the same index and link id;
the others never stop serving meanwhile. Stop: readiness goes false, every front drains its
requests within --exit-timeout-secs and exits, then the models' workers stop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Optional

from kernel.backends.python.execenv import server_command
from kernel.serve.fronts import messages as m
from kernel.serve.fronts.channel import ControlChannel, socket_pairs
from kernel.serve.fronts.hub import Hub

log = logging.getLogger("kernel.core.server")

# A front that does not say Hello this long after it was started has failed to start.
HELLO_TIMEOUT_S = 60.0
# Restarts of one front closer together than this wait, doubling, up to RESTART_MAX_DELAY_S.
RESTART_MIN_DELAY_S = 0.1
RESTART_MAX_DELAY_S = 5.0


@dataclass(eq=False)
class FrontHandle:
    index: int
    process: asyncio.subprocess.Process
    channel: ControlChannel
    hello: bool = False
    listening: bool = False
    attached: set = field(default_factory=set)  # uids of the versions it serves (hub.py)
    started: float = field(default_factory=time.monotonic)
    said_hello: Optional[asyncio.Future] = None


class FrontSupervisor:
    def __init__(self, server, serve_argv: list[str], count: int, client_transports: list, reserved: list):
        """serve_argv: the `kernel serve` arguments the fronts start with (ports resolved);
        client_transports: the transports the fronts run (for the "Started ..." lines);
        reserved: the sockets that hold their ports."""
        self.server = server
        self.hub = Hub(server)
        self.serve_argv = serve_argv
        self.count = count
        self.client_transports = client_transports
        self._reserved = reserved
        self.stopping = False
        self._watchers: set[asyncio.Task] = set()
        self._delays: dict[int, float] = {}
        self._all_ready = False

    # ---- start-up ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every front; return once each has said Hello (it listens, live, not ready)."""
        await asyncio.gather(*(self._spawn(i) for i in range(1, self.count + 1)))
        waits = [f.said_hello for f in self.hub.fronts.values()]
        done, pending = await asyncio.wait(waits, timeout=HELLO_TIMEOUT_S)
        for f in done:
            f.result()  # a front that exited before its Hello: start-up fails
        if pending:
            raise RuntimeError(f"{len(pending)} front process(es) did not start within {HELLO_TIMEOUT_S:g} s")

    async def serve(self) -> None:
        """Start-up loading is over: every front serves every transport; then the server is ready."""
        from kernel.core.server import StartupError

        self.hub.loaded = True
        failures = await self.hub.publish()
        if failures:  # a front could not start what waited for the models: start-up fails, in its words
            raise StartupError(getattr(failures[0], "message", str(failures[0])))
        for t in self.client_transports:
            address = f"{t.address}:{t.port}"
            log.info("Started %s at %s", t.service_name, address, extra={"service": t.service_name, "address": address})
        await self._set_ready()

    async def _set_ready(self) -> None:
        ready = not self.stopping and all(f.hello for f in self.hub.fronts.values()) and \
            len(self.hub.fronts) == self.count and self.hub.loaded
        if ready != self._all_ready:
            self._all_ready = ready
        await self.hub.all_ready(ready)

    async def _spawn(self, index: int) -> FrontHandle:
        (chan_ours, chan_theirs), (fd_ours, fd_theirs) = socket_pairs()
        argv, env = server_command().module(
            "kernel.serve.fronts.front", "--control-fd", str(chan_theirs.fileno()),
            "--fd-channel-fd", str(fd_theirs.fileno()), "--index", str(index), "--fronts", str(self.count),
            "--", *self.serve_argv)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, env=env, pass_fds=(chan_theirs.fileno(), fd_theirs.fileno()))
        finally:
            chan_theirs.close()
            fd_theirs.close()
        loop = asyncio.get_running_loop()
        front = FrontHandle(index, process, None)  # type: ignore[arg-type]
        front.said_hello = loop.create_future()
        front.channel = ControlChannel(m.ToSupervisor, chan_ours, fd_ours, lambda msg, fds: self._handle(front, msg, fds),
                                       name=f"front {index}")
        await front.channel.open()
        self.hub.fronts[index] = front
        watcher = asyncio.ensure_future(self._watch(front))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return front

    async def _handle(self, front: FrontHandle, msg, fds):
        if type(msg) is m.Hello:
            await self.hub.welcome(front)
            if not front.said_hello.done():
                front.said_hello.set_result(None)
            if self.hub.loaded:  # a front that replaced one: the server is whole again
                await self._set_ready()
            return None
        return await self.hub.handle(front, msg, fds)

    async def _watch(self, front: FrontHandle) -> None:
        code = await front.process.wait()
        front.channel.close()
        if self.hub.fronts.get(front.index) is front:
            del self.hub.fronts[front.index]
        if not front.said_hello.done():
            front.said_hello.set_exception(RuntimeError(f"front process {front.index} exited with code {code} "
                                                        "before it could serve"))
        if self.stopping:
            return
        log.error("front process %d (pid %d) exited with code %s; starting another", front.index, front.process.pid,
                  code)
        await self._set_ready()
        delay = self._delays.get(front.index, 0.0) if time.monotonic() - front.started < 10 else 0.0
        self._delays[front.index] = min(RESTART_MAX_DELAY_S, max(RESTART_MIN_DELAY_S, delay * 2))
        await asyncio.sleep(delay)
        if not self.stopping:
            try:
                await self._spawn(front.index)
            except Exception as exc:  # noqa: BLE001
                log.error("could not start front process %d again: %s", front.index, exc)

    # ---- stop ------------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Readiness false, every front drains (within --exit-timeout-secs) and exits; stragglers are killed."""
        self.stopping = True
        await self._set_ready()
        fronts = list(self.hub.fronts.values())
        for f in fronts:
            try:
                f.channel.send(m.Stop(0))
            except ConnectionError:
                pass
        timeout = float(self.server.options.exit_timeout_secs) + 2.0
        waits = [asyncio.ensure_future(f.process.wait()) for f in fronts]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=timeout)
            for f in fronts:
                if f.process.returncode is None:
                    try:
                        f.process.kill()
                    except ProcessLookupError:
                        pass
            if pending:
                await asyncio.wait(pending, timeout=5)
        for s in self._reserved:
            s.close()

    def pids(self) -> list[int]:
        return [f.process.pid for f in self.hub.fronts.values()]
