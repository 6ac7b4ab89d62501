"""A front process's model instance over a link to a worker another process owns.

With several front processes (issue 32), one process (the supervisor) owns each worker process
and its primary link (WorkerInstance); every other front reaches the same worker over a link of
its own (WorkerInstance.open_link gives its sockets) and serves it through a LinkedInstance: the
same request path (request_path.py: its own arenas, keys, pending requests and executions), without
the process. Starting, restarting and stopping the worker are the owner's; BLS calls, the model
loading API, custom metrics and log settings travel on the primary link only.

The link's end of file means the worker is gone (or dropped the link): this front's pending
requests fail with the words a dead worker's get ("Stub process '<name>' is not healthy."), and the
instance is unhealthy until the owner has restarted the worker and `replace` brings the new link.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Optional

from kernel.backends.python import messages
from kernel.backends.python.framing import MessageChannel
from kernel.backends.python.instance import WorkerFacts, WorkerSettings
from kernel.backends.python.request_path import RequestPath
from kernel.core.backend import CoreHandle, ModelSource

log = logging.getLogger("kernel.python")


class LinkedInstance(RequestPath):
    shared = True  # other processes feed this worker too: schedulers pick by load, never queue here

    def __init__(
        self,
        source: ModelSource,
        name: str,
        kind: str,
        device_id: int,
        settings: WorkerSettings,
        core: Optional[CoreHandle],
        link_id: int,
        channel_sock: socket.socket,
        fd_sock: socket.socket,
        facts: WorkerFacts,
    ):
        if not 1 <= link_id <= 254:
            raise ValueError(f"link id {link_id} is not in 1..254")
        self.link_id = link_id
        self._init_path(source, name, kind, device_id, settings, core)
        self._reset_path()
        self._socks: Optional[tuple[socket.socket, socket.socket]] = (channel_sock, fd_sock)
        self._apply(facts)

    def _apply(self, facts: WorkerFacts) -> None:
        self.facts = facts
        self._async_execute = facts.async_execute
        self._has_is_ready = facts.has_is_ready

    async def start(self) -> None:
        """Connect the link; healthy from here."""
        loop = asyncio.get_running_loop()
        channel_sock, self._fd_sock = self._socks
        self._socks = None
        self._start_trim(loop)

        def protocol() -> MessageChannel:
            channel = MessageChannel(messages.ToFront, self._on_message, None)
            channel._on_lost = lambda exc: self._on_lost(channel)
            return channel

        _, self.channel = await loop.create_unix_connection(protocol, sock=channel_sock)
        self.healthy = True
        self.notify_available()

    async def replace(self, channel_sock: socket.socket, fd_sock: socket.socket, facts: WorkerFacts) -> None:
        """The owner restarted the worker (or opened this link again): serve the new link, from fresh state."""
        if self._socks is not None:  # never started: its sockets are not ours any more
            for sock in self._socks:
                sock.close()
        elif self.channel is not None:
            self._close("was replaced")
        self._reset_path()
        self._socks = (channel_sock, fd_sock)
        self._apply(facts)
        self._stopping = False
        await self.start()

    async def stop(self, timeout: float) -> None:
        """Let this front's pending requests finish (up to timeout), then close the link; the worker
        and its other links go on (it frees what this link held when it reads the end of file)."""
        self._stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.in_flight and loop.time() < deadline and self.healthy:  # (sent, or being copied)
            await asyncio.sleep(0.01)
        if self._socks is not None:
            for sock in self._socks:
                sock.close()
            self._socks = None
        self._close("was stopped")

    def _close(self, why: str) -> None:
        self.healthy = False
        self._fail_pending(f"Stub process '{self.name}' {why}.")
        self._release_resources()  # (closes the transport: the worker reads end of file)
        self.channel = None  # its connection_lost, still to come, is not this link's news any more

    def _on_lost(self, channel: MessageChannel) -> None:
        if channel is not self.channel:
            return  # a link replaced or stopped already
        self.healthy = False
        if not self._stopping:
            log.error("Stub process '%s' is not healthy: its link %d was closed", self.name, self.link_id)
        self._fail_pending(f"Stub process '{self.name}' is not healthy.", framed=False)  # Triton's words, alone
        self._release_resources()
        self.channel = None
