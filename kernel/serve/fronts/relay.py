"""The supervisor's end of a front's relay: requests for models one process must serve.

Some models cannot be fed by every front on its own: a sequence-batched model keeps each
sequence's slot and the order of its requests in its scheduler, and a model whose instances are
not worker processes (a bound callable, a remote model) lives in the supervisor. A front hands
their requests to the supervisor over a link that speaks the workers' protocol (Execute,
Responses, Cancel, Release and the arenas': backends/python/messages.py), so the front's end is
an ordinary linked instance; here each request is submitted to the supervisor's own core, like a
client's, and its responses go back as they come. Inputs are copied out of the front's arena at
once (the model may keep them as long as it likes), outputs above the inline size go through
this side's arena, which the front maps and gives back (Release) once its client has them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import msgspec

from kernel.backends.python import messages, wire
from kernel.backends.python.arena import Arena, PeerArena
from kernel.backends.python.framing import MessageChannel
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor, RequestedOutput

log = logging.getLogger("kernel.fronts")

ARENA_SIZE = 16 * 1024 * 1024  # grows in steps of this much when a large output needs it


class RelayHost:
    def __init__(self, core, link_id: int, chan_sock: socket.socket, fd_sock: socket.socket):
        self.core = core
        self.link_id = link_id
        self._chan_sock = chan_sock
        self._fd_sock = fd_sock
        self._fd_sock.setblocking(True)
        self._arena = Arena(ARENA_SIZE, ARENA_SIZE, f"kernel-relay-{link_id}")
        self._arena.on_new_segment = self._announce
        self._peer = PeerArena()
        self._pending: dict[int, InferRequest] = {}
        self.channel: MessageChannel | None = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        _, self.channel = await loop.create_unix_connection(
            lambda: MessageChannel(messages.ToWorker, self._on_message, self._lost), sock=self._chan_sock)

    # ---- from the front -----------------------------------------------------------------------

    def _on_message(self, msg) -> None:
        kind = type(msg)
        if kind is messages.Execute:
            self._execute(msg)
        elif kind is messages.Cancel:
            request = self._pending.get(msg.key)
            if request is not None:
                request.cancel()
        elif kind is messages.Release:
            for seg, off in msg.regions:
                self._arena.free(seg, off)
        elif kind is messages.SegmentAdded:
            _, fds, _, _ = socket.recv_fds(self._fd_sock, 1, 1)
            self._peer.add(msg.segment, fds[0], msg.size)
        elif kind is messages.SegmentRemoved:
            self._peer.remove(msg.segment)
        elif kind is messages.CheckReady:
            self._send(messages.ReadyResult(msg.key, True))

    def _execute(self, msg: messages.Execute) -> None:
        now = time.monotonic_ns()
        releases = []
        for r in msg.requests:
            try:
                inputs = []
                for t in r.inputs:
                    if t.data is not None:
                        inputs.append(InferTensor(t.name, t.datatype, t.shape, raw=t.data))
                    else:  # copied out at once: the front may reuse its region as soon as it is back
                        inputs.append(InferTensor(t.name, t.datatype, t.shape,
                                                  raw=bytes(self._peer.view(t.segment, t.offset, t.nbytes))))
                        releases.append((t.segment, t.offset))
            except ValueError as exc:
                self._answer(r.key, error=KernelError(ErrorCode.INTERNAL, f"bad tensor location from the front: {exc}"))
                continue
            params = msgspec.json.decode(r.parameters) if r.parameters and r.parameters != "{}" else {}
            request = InferRequest(
                r.model_name, r.model_version, r.request_id, inputs,
                [RequestedOutput(n) for n in r.requested_outputs] or None, params,
                priority=r.priority, timeout_us=r.timeout_us, correlation_id=r.correlation_id, flags=r.flags)
            request.on_response = self._responder(r.key)
            self._pending[r.key] = request
            try:
                self.core.submit(request)
            except KernelError as exc:
                self._pending.pop(r.key, None)
                self._answer(r.key, error=exc)
        if releases:
            self._send(messages.Release(releases))
        # One record per Execute, at once: this end has no execute() of its own to time, and the
        # front's instance must never look busy (statistics are the supervisor's core's).
        self._send(messages.Responses([], [messages.Execution(0, now, now, now, now, trace_key=msg.trace_key)]))

    def _responder(self, key: int):
        def on_response(response: InferResponse) -> None:
            if response.final:
                self._pending.pop(key, None)
            if response.error is not None:
                self._answer(key, error=response.error, final=response.final)
                return
            try:
                tensors = [wire.pack(t.name, t.datatype, t.shape, t.raw, self._arena) for t in response.outputs]
            except KernelError as exc:
                self._answer(key, error=exc, final=response.final)
                return
            params = msgspec.json.encode(response.parameters).decode() if response.parameters else ""
            self._send(messages.Responses([messages.Response(key, tensors, None, params, response.final)]))

        return on_response

    def _answer(self, key: int, error: KernelError, final: bool = True) -> None:
        self._send(messages.Responses([messages.Response(key, error=messages.Error(error.code.name, error.message),
                                                         final=final)]))

    # ---- to the front -------------------------------------------------------------------------

    def _send(self, msg) -> None:
        if self.channel is not None and not self.channel.closed:
            try:
                self.channel.send(msg)
            except ConnectionError:
                pass

    def _announce(self, index: int, segment) -> None:
        if self.channel is None or self.channel.closed:
            return
        socket.send_fds(self._fd_sock, [b"\0"], [segment.fd])
        self.channel.send(messages.SegmentAdded(index, segment.size))

    def _lost(self, exc) -> None:
        """The front is gone: its requests are cancelled, everything lent to it is freed."""
        pending, self._pending = self._pending, {}
        for request in pending.values():
            request.cancel()
        self.close()

    def close(self) -> None:
        if self.channel is not None and self.channel.transport is not None:
            self.channel.transport.close()
        self._arena.close()
        self._peer.close()
        self._fd_sock.close()
