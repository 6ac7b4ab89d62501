"""The worker's side of its two arenas: its own (outputs, BLS inputs) and the front's (inputs, BLS
outputs, mapped here).

Its own arena is allocated from whichever thread packs a tensor: a response is packed when the
model hands it over, on the thread that calls send() (responses.py). A segment grown that way is
announced to the front (its fd on the fd channel, then SegmentAdded) before any message that uses
it: the worker calls `send_announcements` before it sends responses or a BLS request, and a growth
off the loop also schedules it on the loop. Idle grown segments are given back (arena_trim.py).

With links to other front processes (worker_links.py), the one own arena serves them all: each
link is told of every segment (a new link of those that exist already) before the first message on
it that may use one, and of every segment removed. Each link has a peer arena of its own (its
front's inputs): an input array remembers its link, so its region goes back to the right front.

A large input is a numpy view of the front's region (no copy in). The region is given back
(Release) when the last array over it is gone, not when the request is answered: a model may keep
an input array (or the whole request) as long as it likes, and the front must not hand that memory
to another request meanwhile.
"""

from __future__ import annotations

import socket
import threading
import weakref

import numpy as np

from kernel.backends.python import messages
from kernel.backends.python.arena import Arena, PeerArena
from kernel.backends.python.arena_trim import IdleTrim


class WorkerArenas:
    def __init__(self, worker, default_size: int, growth_size: int, idle_seconds: float, name: str):
        self._worker = worker  # its channel, fd channel, loop, call_on_loop and release_peer_region
        self.arena = Arena(default_size, growth_size, name)
        self.arena.on_new_segment = self._segment_created
        self.peer = PeerArena()
        self._unannounced: list = []  # (index, Segment) grown and not yet announced to the front
        self._announce_lock = threading.Lock()
        self._idle_seconds = idle_seconds
        self._trim: IdleTrim | None = None
        self._held: dict[int, tuple] = {}  # id(weakref to an input's root array) -> (weakref, region, link)
        self._links: list = []  # worker_links.Link: each keeps its own list of segments to announce

    def start(self, loop) -> None:
        """On the worker's loop, once it runs."""
        self._trim = IdleTrim(self.arena, loop, self._idle_seconds, self._send_removed, before=self.send_announcements)

    # ---- own arena: growth announced, idle segments given back ------------------------------

    @property
    def unannounced(self) -> bool:
        return bool(self._unannounced)

    def _segment_created(self, index: int, segment) -> None:
        """The arena grew (under its lock, on whichever thread packed a tensor)."""
        with self._announce_lock:
            self._unannounced.append((index, segment))
            for link in self._links:
                link.unannounced.append((index, segment))
        worker = self._worker
        if threading.get_ident() != worker._loop_thread:
            worker.loop.call_soon_threadsafe(self._announce_now)

    def _announce_now(self) -> None:
        try:
            self.send_announcements()
        except OSError:  # the front is gone
            pass

    def send_announcements(self) -> None:
        """Announce the segments the arena grew (fd, then SegmentAdded) before a message that may use them.

        Called where this thread may write the channel: on the loop, or by a thread sending
        directly while an inline execute holds it. Each (fd, message) pair goes out under the
        channel's lock, so no other announcement slips between an fd and its message.
        """
        if not self._unannounced:
            return
        channel = self._worker.channel
        with channel.lock:
            with self._announce_lock:
                pending, self._unannounced = self._unannounced, []
            for index, segment in pending:
                socket.send_fds(self._worker.fd_sock, [b"\0"], [segment.fd])
                channel.send(messages.SegmentAdded(index, segment.size))

    def _send_removed(self, index: int) -> None:
        try:
            self._worker.channel.send(messages.SegmentRemoved(index))
        except ConnectionError:
            pass
        for link in self._links:
            with self._announce_lock:
                pending = [entry for entry in link.unannounced if entry[0] != index]
                told = len(pending) == len(link.unannounced)
                link.unannounced = pending
            if told and link.channel is not None:  # (never told of it: nothing to take back)
                try:
                    link.channel.send(messages.SegmentRemoved(index))
                except ConnectionError:
                    pass

    # ---- links: every segment announced on each, lazily ----------------------------------------

    def add_link(self, link) -> None:
        """A new link is told of every segment that exists now, before its first message that may use one."""
        with self.arena._lock, self._announce_lock:  # (the order _segment_created takes them in)
            link.unannounced = list(self.arena.segments.items())
            self._links.append(link)

    def remove_link(self, link) -> None:
        with self._announce_lock:
            if link in self._links:
                self._links.remove(link)
            link.unannounced = []

    def announce_to(self, link) -> None:
        """Tell `link` of the segments it does not know yet (on the loop, before sending it anything)."""
        with self._announce_lock:
            pending, link.unannounced = link.unannounced, []
        for index, segment in pending:
            socket.send_fds(link.fd_sock, [b"\0"], [segment.fd])
            link.channel.send(messages.SegmentAdded(index, segment.size))

    # ---- the front's arena: input views, given back when gone ----------------------------------

    def input_array(self, t: messages.Tensor, dtype, link=None) -> np.ndarray:
        """A writable view of an input in the arena of the front of `link` (None: the primary's);
        ValueError for a bad location."""
        peer = self.peer if link is None else link.peer
        root = np.frombuffer(peer.view(t.segment, t.offset, t.nbytes), dtype)
        arr = root.reshape(t.shape)
        ref = weakref.ref(root, self._input_gone)
        self._held[id(ref)] = (ref, t.segment, t.offset, link)
        return arr

    @property
    def held_inputs(self) -> int:
        """Input arrays over a front's arena still alive here (UsageReport)."""
        return len(self._held)

    def _input_gone(self, ref) -> None:
        """The last array over an input region is gone (on whichever thread dropped it)."""
        entry = self._held.pop(id(ref), None)
        if entry is not None:
            worker = self._worker
            worker.call_on_loop(worker.release_peer_region, *entry[1:])
