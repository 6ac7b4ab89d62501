"""The control channel between the supervisor and one front: framed msgspec messages, calls that
wait for their Reply, and file descriptors passed alongside (a worker link's sockets).

Two socket pairs per front, as between a front and a worker (backends/python): the channel
carries messages (kernel.backends.python.framing), the fd socket carries descriptors, each sent
just before the message that announces them; the reader takes them when it reads that message.
A message is handled in a task of its own, so a call that waits (a front draining a model) never
holds up the channel; its Reply goes back with the message's key.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from typing import Any, Awaitable, Callable, Optional

from kernel.backends.python.framing import MessageChannel
from kernel.core.errors import ErrorCode, KernelError
from kernel.serve.fronts.messages import Fault, Reply

log = logging.getLogger("kernel.fronts")

Handler = Callable[[Any, list[int]], Awaitable[Any]]


class ControlChannel:
    def __init__(self, decode_type, sock: socket.socket, fd_sock: socket.socket, handler: Handler,
                 on_lost: Optional[Callable[[], None]] = None, name: str = "front"):
        """handler(message, fds) is awaited for every message that is not a Reply; its value is
        the Reply's (KernelError: the Reply's fault). fds are the message's descriptors, owned by
        the handler from then on."""
        self._decode_type = decode_type
        self._sock = sock
        self._fd_sock = fd_sock
        self._fd_sock.setblocking(True)
        self._handler = handler
        self._on_lost = on_lost
        self.name = name
        self._keys = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()
        self._channel: Optional[MessageChannel] = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        _, self._channel = await loop.create_unix_connection(
            lambda: MessageChannel(self._decode_type, self._on_message, self._lost), sock=self._sock)

    @property
    def closed(self) -> bool:
        return self._channel is None or self._channel.closed

    # ---- sending ------------------------------------------------------------------------------

    def send(self, message, fds: tuple[int, ...] | list[int] = ()) -> None:
        """Send without waiting for a reply (message.key 0)."""
        if self.closed:
            raise ConnectionError(f"the control channel to {self.name} is closed")
        if fds:
            socket.send_fds(self._fd_sock, [b"\0"], list(fds))
        self._channel.send(message)

    def request(self, message, fds: tuple[int, ...] | list[int] = ()) -> asyncio.Future:
        """Send `message` now (its key is set here; its fds are sent, so the caller may close its
        copies) and return the future of its Reply's value: KernelError for a fault,
        ConnectionError when the channel closes first."""
        key = next(self._keys)
        message.key = key
        future = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        future.add_done_callback(lambda _: self._waiting.pop(key, None))
        try:
            self.send(message, fds)
        except BaseException:
            self._waiting.pop(key, None)
            raise
        return future

    async def call(self, message, fds: tuple[int, ...] | list[int] = (), timeout: Optional[float] = None) -> Any:
        """request() and wait for the value (up to `timeout` seconds)."""
        future = self.request(message, fds)
        return await (asyncio.wait_for(future, timeout) if timeout is not None else future)

    # ---- receiving -----------------------------------------------------------------------------

    def _on_message(self, message) -> None:
        if type(message) is Reply:
            future = self._waiting.get(message.key)
            if future is not None and not future.done():
                if message.fault is not None:
                    future.set_exception(KernelError(ErrorCode[message.fault.code], message.fault.message))
                else:
                    future.set_result(message.value)
            return
        count = getattr(message, "fds", 0)
        fds: list[int] = []
        if count:
            _, fds, _, _ = socket.recv_fds(self._fd_sock, 1, count)
        task = asyncio.ensure_future(self._handle(message, list(fds)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, message, fds: list[int]) -> None:
        key = getattr(message, "key", 0)
        try:
            value = await self._handler(message, fds)
            reply = Reply(key, value)
        except KernelError as exc:
            reply = Reply(key, fault=Fault(exc.code.name, exc.message))
        except Exception as exc:  # noqa: BLE001 - the other side gets the failure, the channel goes on
            log.exception("handling %s from %s failed", type(message).__name__, self.name)
            reply = Reply(key, fault=Fault("INTERNAL", f"{type(exc).__name__}: {exc}"))
        if key and not self.closed:
            try:
                self._channel.send(reply)
            except ConnectionError:
                pass

    def _lost(self, exc) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError(f"the control channel to {self.name} closed"))
        if self._on_lost is not None:
            self._on_lost()

    def close(self) -> None:
        if self._channel is not None and self._channel.transport is not None:
            self._channel.transport.close()
        self._fd_sock.close()


def socket_pairs() -> tuple[tuple[socket.socket, socket.socket], tuple[socket.socket, socket.socket]]:
    """(channel pair, fd pair): for each, (ours, theirs)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM), socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
