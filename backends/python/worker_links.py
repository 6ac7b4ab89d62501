"""A worker's links to front processes other than its owner (issue 32: several fronts, one worker).

The primary link (the worker's own channel, link 0) belongs to the process that started the
worker: lifecycle, BLS, model control, custom metrics and readiness travel there, and nothing here
changes its path. Other fronts each get a link (LinkAdded on the primary, its two sockets on the
primary fd channel): a message channel, an fd channel, the front's arena mapped here (its inputs),
and what the worker sends it: responses, execution records and releases, in one message per loop
iteration, as on the primary. The worker's own arena (outputs) is one for all links; every link is
told of its segments (worker_arena.py).

Keys: inside the worker a link's request keys carry its serial in the bits from TAG_SHIFT up
(`tag`): serials are never reused, so the late responses of a link that is gone never reach the
link that replaced it under the same id, even when its front reuses the same keys. Responses leave
with the front's own key again. The primary's tag is 0: its keys are unchanged. GPU tensors a
link's front lends (their tokens) are tagged the same way, so each goes back to its own front.

Losing a link (end of file: its front died or stopped) costs the worker nothing else: the link's
open requests are cancelled for the model (is_cancelled() is true) and forgotten (their later
responses are dropped, the regions those were packed into freed), the output regions and GPU
exports its front still held are freed, its arena unmapped once the model drops its last input
array over it. The primary and the other links keep serving.

A link's messages are read on the loop, and by `poll` while an inline execute holds the loop (so a
Cancel reaches is_cancelled()); they are written only from the loop's thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import threading

from kernel.backends.python import gpu_worker, messages
from kernel.backends.python.arena import PeerArena
from kernel.backends.python.board import LINK0, Board
from kernel.backends.python.board import SIZE as BOARD_SIZE
from kernel.backends.python.framing import frame
from kernel.backends.python.inline_channel import InlineChannel

log = logging.getLogger("kernel.worker")

TAG_SHIFT = 56
TAGGED = 1 << TAG_SHIFT  # keys at or above: a link's (tagged)
KEY_MASK = TAGGED - 1


class Link:
    __slots__ = ("id", "serial", "tag", "channel", "fd_sock", "peer", "outbox", "releases", "executions",
                 "held", "exports", "unannounced", "closed")

    def __init__(self, link_id: int, serial: int, fd_sock: socket.socket):
        self.id = link_id
        self.serial = serial
        self.tag = serial << TAG_SHIFT
        self.channel: InlineChannel | None = None  # once connected
        self.fd_sock = fd_sock
        self.peer = PeerArena()  # its front's arena: request inputs
        self.outbox: list[messages.Response] = []
        self.releases: list[tuple[int, int]] = []  # regions of its front's arena the model is done with
        self.executions: list[messages.Execution] = []
        self.held: set[tuple[int, int]] = set()  # regions of the worker's arena its front still reads
        self.exports: set[int] = set()  # GPU exports its front still holds
        self.unannounced: list = []  # (index, Segment) of the worker's arena not yet told (worker_arena.py)
        self.closed = False


class WorkerLinks:
    """The links of one worker, beside its primary channel."""

    def __init__(self, worker):
        self.worker = worker
        self.by_serial: dict[int, Link] = {}
        self.by_id: dict[int, Link] = {}
        self._serials = itertools.count(1)
        self._dirty: dict[int, Link] = {}  # serial -> link with something to send at the next flush
        self.board: Board | None = None

    # ---- added and lost ---------------------------------------------------------------------

    def add(self, link_id: int) -> None:
        """LinkAdded on the primary: its sockets wait on the primary fd channel."""
        worker = self.worker
        _, fds, _, _ = socket.recv_fds(worker.fd_sock, 1, 2)
        if len(fds) != 2:
            for fd in fds:
                socket.close(fd)
            log.error("link %d came without its two sockets; ignored", link_id)
            return
        old = self.by_id.get(link_id)
        if old is not None:
            self.lost(old)  # opened again: its front was replaced
        link = Link(link_id, next(self._serials), socket.socket(fileno=fds[1]))
        self.by_serial[link.serial] = link
        self.by_id[link_id] = link
        if self.board is None:
            self._start_board()
            worker.linked = True
        worker.arenas.add_link(link)
        sock = socket.socket(fileno=fds[0])
        try:  # the board first, now (the link's transport is made on the loop, maybe after a long execute)
            socket.send_fds(link.fd_sock, [b"\0"], [self.board.fd])
            sock.sendall(frame(messages.Board(BOARD_SIZE)))
        except OSError as exc:
            log.error("link %d is closed already: %s", link_id, exc)
            sock.close()
            self.lost(link)
            return
        # The channel exists from now on, its transport once the loop runs: an inline execute that
        # holds the loop meanwhile (this very one, if LinkAdded was read by its pumping) reads the
        # link through the channel's own socket, so a Cancel on it is seen all the same.
        link.channel = InlineChannel(messages.ToWorker, lambda msg: self.on_message(link, msg),
                                     lambda exc: self._on_lost(link), sock.dup(),
                                     lambda frame, error: self.worker.on_undecodable(frame, error, link))
        if worker._inline_busy:
            link.channel.set_direct_reads(True)
        asyncio.ensure_future(self._connect(link, sock))

    async def _connect(self, link: Link, sock: socket.socket) -> None:
        try:
            await self.worker.loop.create_unix_connection(lambda: link.channel, sock=sock)
        except OSError as exc:
            log.error("link %d could not be connected: %s", link.id, exc)
            sock.close()
            self.lost(link)
            return
        if link.closed:
            self._close(link)
        elif link.outbox or link.executions or link.releases:  # (answers made before it was connected)
            self._dirty[link.serial] = link
            self.worker._schedule_flush()

    def _start_board(self) -> None:
        """The first link: from now on the worker counts what it holds, per link (board.py)."""
        worker = self.worker
        board = self.board = Board(f"kernel-{worker.instance_name}-board")
        primary = sum(1 for key in worker.sinks if key < TAGGED)
        board.slots[LINK0] = primary
        board.slots[0] = primary
        with worker.channel.lock:  # (an fd and its message, as segment announcements go)
            socket.send_fds(worker.fd_sock, [b"\0"], [board.fd])
            worker.channel.send(messages.Board(BOARD_SIZE))

    def _on_lost(self, link: Link) -> None:
        worker = self.worker
        if threading.get_ident() != worker._loop_thread:
            worker.loop.call_soon_threadsafe(self.lost, link)
        else:
            self.lost(link)

    def lost(self, link: Link) -> None:
        """The link is gone: cancel and forget its requests, free what its front held."""
        if link.closed:
            return
        link.closed = True
        worker = self.worker
        self.by_serial.pop(link.serial, None)
        if self.by_id.get(link.id) is link:
            del self.by_id[link.id]
        self._dirty.pop(link.serial, None)
        worker.arenas.remove_link(link)
        serial = link.serial
        for key in [k for k in worker.sinks if k >> TAG_SHIFT == serial]:
            sink = worker.sinks.pop(key)
            sink.cancelled = True  # what the model sees from now on
            sink.regions = None
        for response in link.outbox:
            self.drop(response)
        link.outbox, link.releases, link.executions = [], [], []
        for segment, offset in link.held:
            worker.arena.free(segment, offset)
        link.held.clear()
        if link.exports:
            gpu_worker.free(list(link.exports))
            link.exports.clear()
        gpu_worker.link_closed(link.serial)
        dropped = worker.merger.drop_link(link) if worker.merger is not None else 0
        if self.board is not None:
            self.board.forget(link.id)
            self.board.executed(dropped)
        self._close(link)
        log.info("link %d of model instance '%s' closed; what it held is freed", link.id, worker.instance_name)

    def _close(self, link: Link) -> None:
        link.peer.close()  # (a mapping an input array still uses stays until that array is gone)
        link.fd_sock.close()
        if link.channel is not None:
            link.channel.close_direct()
            if link.channel.transport is not None:
                link.channel.transport.close()

    def drop(self, response: messages.Response) -> None:
        """A response for a link that is gone: free the worker's memory its outputs were packed into."""
        arena = self.worker.arena
        tokens = []
        for t in response.outputs:
            if t.data is None:
                if t.ipc is not None:
                    tokens.append(t.token)
                elif t.owner < 0:
                    arena.free(t.segment, t.offset)
        if tokens:
            gpu_worker.free(tokens)

    # ---- what a link's front sends ----------------------------------------------------------

    def on_message(self, link: Link, msg) -> None:
        worker = self.worker
        kind = type(msg)
        if link.closed:
            return
        if kind is messages.Execute:
            if self.board is not None:
                self.board.received(link.id, len(msg.requests))
            worker.execute(msg.requests, msg.trace_key, link)
        elif kind is messages.Cancel:
            worker.cancel(msg.key | link.tag)
        elif kind is messages.Gathered:
            if worker.merger is not None:
                worker.merger.gathered(msg.round)
        elif kind is messages.Release:
            held = link.held
            for region in msg.regions:
                region = tuple(region)
                if region in held:  # only what this front was given
                    held.discard(region)
                    worker.arena.free(*region)
        elif kind is messages.DeviceRelease:
            tokens = [t for t in msg.tokens if t in link.exports]
            link.exports.difference_update(tokens)
            gpu_worker.free(tokens)
        elif kind is messages.DeviceUnmap:
            gpu_worker.unmap(msg, link.serial)
        elif kind is messages.SegmentAdded:
            link.peer.receive(link.fd_sock, msg.segment, msg.size)
        elif kind is messages.SegmentRemoved:
            link.peer.remove(msg.segment)
        elif kind is messages.CheckReady:
            asyncio.ensure_future(worker.check_ready(msg.key, link))
        elif kind is messages.Usage:
            link.channel.send(self.usage(msg.key))
        else:
            log.warning("link %d: %s is for the primary link only; ignored", link.id, kind.__name__)

    def usage(self, key: int) -> messages.UsageReport:
        worker = self.worker
        gpu = gpu_worker.support() if gpu_worker.loaded() else None
        return messages.UsageReport(key, worker.arena.allocated, worker.arenas.held_inputs, len(worker.sinks),
                                    len(self.by_serial), gpu.arena.live if gpu is not None else 0)

    # ---- what the worker sends a link: routed by tag, sent at the worker's flush ---------------

    def link_of(self, tagged_key: int) -> Link | None:
        return self.by_serial.get(tagged_key >> TAG_SHIFT)

    def queue(self, response: messages.Response) -> None:
        link = self.by_serial.get(response.key >> TAG_SHIFT)
        if link is None:
            self.drop(response)
            return
        response.key &= KEY_MASK
        link.outbox.append(response)
        self._dirty[link.serial] = link
        self.worker._schedule_flush()

    def execution(self, link: Link, record: messages.Execution) -> None:
        if link.closed:
            return
        link.executions.append(record)
        self._dirty[link.serial] = link
        self.worker._schedule_flush()

    def release(self, link: Link, segment: int, offset: int) -> None:
        if link.closed:
            return
        link.releases.append((segment, offset))
        self._dirty[link.serial] = link
        self.worker._schedule_flush()

    def device_release(self, tokens: list[int]) -> None:
        """Loans (the fronts' GPU tensors) the model is done with: each goes back to its own front."""
        primary = [t for t in tokens if t < TAGGED]
        if primary:
            self.worker.channel.send(messages.DeviceRelease(primary))
        per_link: dict[int, list[int]] = {}
        for t in tokens:
            if t >= TAGGED:
                per_link.setdefault(t >> TAG_SHIFT, []).append(t & KEY_MASK)
        for serial, own in per_link.items():
            link = self.by_serial.get(serial)
            if link is not None and link.channel is not None:
                try:
                    link.channel.send(messages.DeviceRelease(own))
                except ConnectionError:
                    pass

    def flush(self, primary_out: list) -> None:
        """At the worker's flush (on the loop): the board's counts, then each link's messages."""
        board = self.board
        if board is not None and primary_out:
            board.answered(0, sum(1 for r in primary_out if r.final))
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, {}
        arenas = self.worker.arenas
        for link in dirty.values():
            if link.channel.transport is None:
                continue  # not connected yet: sent once it is (_connect)
            out, link.outbox = link.outbox, []
            releases, link.releases = link.releases, []
            executions, link.executions = link.executions, []
            finals = 0
            held, exports = link.held, link.exports
            for r in out:
                finals += r.final
                for t in r.outputs:
                    if t.data is None:
                        if t.ipc is not None:
                            exports.add(t.token)
                        elif t.owner < 0:
                            held.add((t.segment, t.offset))
            if board is not None:
                board.answered(link.id, finals)
            try:
                if link.unannounced:
                    arenas.announce_to(link)
                if out or executions:
                    link.channel.send(messages.Responses(out, executions, releases))
                elif releases:
                    link.channel.send(messages.Release(releases))
            except (ConnectionError, OSError):
                pass  # its end of file is on the way: lost() frees what it held

    # ---- while an inline execute holds the loop -----------------------------------------------

    def hold(self, on: bool) -> None:
        for link in self.by_serial.values():
            link.channel.set_direct_reads(on)

    def _front_channels(self) -> list:
        """The channel of every front, the primary's first, whose link is not closed."""
        return [self.worker.channel, *(link.channel for link in self.by_serial.values()
                                       if not link.closed and link.channel is not None)]

    def gather(self, round_: int, room: int) -> int:
        """Ask every front for what it queued (worker_merge.py); how many were asked (a link not yet
        connected refuses the send, as a closing one does)."""
        ask = messages.Gather(round_, room)
        asked = 0
        for channel in self._front_channels():
            try:
                channel.send(ask)
            except (ConnectionError, OSError):
                continue
            asked += 1
        return asked

    def read_ready(self) -> None:
        """Dispatch what every front has sent already (the loop's thread; a link closed meanwhile reads nothing)."""
        for channel in self._front_channels():
            channel.read_ready()

    def poll(self) -> None:
        """Dispatch what every link's front sent already (a Cancel, say), without waiting."""
        if not self.by_serial:
            return
        loop = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(self.worker.loop)  # handlers may schedule tasks
        try:
            for link in list(self.by_serial.values()):
                if not link.closed:
                    try:
                        link.channel.pump(0)
                    except ConnectionError:
                        pass  # (its connection_lost ran: lost())
        finally:
            asyncio.events._set_running_loop(loop)
