"""The worker's channel, readable and writable while a synchronous execute runs on the loop.

A synchronous `execute` runs inline on the worker's loop (no thread hop per
request). While it runs the loop is not polling, so calls that wait for the
front process (BLS `exec()`, the model loading API, metric reads) and
`is_cancelled()` read the socket themselves through `pump`, and everything
sent meanwhile goes straight to the socket (`direct`), bypassing the
transport's buffer that only the loop would flush.

Messages are dispatched from one queue, so a message read by `pump` never
overtakes one the loop had already read but not yet handed out.

The model's own threads may wait for the front too (a BLS call from a pool
that execute joins): while an inline execute holds the loop they send and
pump themselves. `lock` serialises those direct reads and writes (and a worker's
announcement of a new arena segment: its fd and its message), and `direct` only
changes under it, so no thread reads the socket once the loop reads it again.

A worker's links to other front processes (worker_links.py) are read the same way while an
inline execute runs (a Cancel must reach is_cancelled()), but never written directly: only
the loop's thread writes them, through the transport, so `direct_writes` stays off for them.
"""

from __future__ import annotations

import collections
import select
import socket
import threading

from kernel.backends.python.framing import _HEADER, MessageChannel

_READ_SIZE = 256 * 1024
# Longest single wait on the socket while holding the lock: another waiter may need it.
_POLL_STEP_S = 0.005


class InlineChannel(MessageChannel):
    def __init__(self, decode_type, on_message, on_lost, sock: socket.socket, on_undecodable=None):
        super().__init__(decode_type, on_message, on_lost, on_undecodable)
        self._sock = sock  # a duplicate of the channel socket, for reads and writes off the loop
        self._sock.setblocking(False)
        self._readable = select.poll()
        self._readable.register(sock, select.POLLIN)
        self._writable = select.poll()
        self._writable.register(sock, select.POLLOUT)
        self._pending: collections.deque = collections.deque()
        self.direct = False  # set while an inline execute runs (pump reads); changed only under lock
        self.direct_writes = False  # ... and sends bypass the transport (the primary link only)
        self.lock = threading.RLock()

    def data_received(self, data: bytes) -> None:
        self._pending.extend(self._decode(data))
        self._dispatch()

    def _dispatch(self) -> None:
        pending = self._pending
        while pending:
            self._on_message(pending.popleft())

    def can_go_direct(self) -> bool:
        """Nothing waits in the transport's buffer, so direct writes keep the message order."""
        return not self.closed and self.transport is not None and not self.transport.get_write_buffer_size()

    def send(self, message) -> None:
        if self.direct_writes:
            with self.lock:
                if self.direct_writes:
                    if self.closed:
                        raise ConnectionError("channel is closed")
                    payload = self._encoder.encode(message)
                    self._write_all(len(payload).to_bytes(_HEADER, "little") + payload)
                    return
        super().send(message)

    def set_direct(self, direct: bool) -> None:
        with self.lock:
            self.direct = self.direct_writes = direct

    def set_direct_reads(self, direct: bool) -> None:
        """Direct reads only (a worker's link: written by the loop's thread alone)."""
        with self.lock:
            self.direct = direct

    def close_direct(self) -> None:
        """Close the duplicate socket (a link that is gone; the transport closes the original)."""
        with self.lock:
            self.direct = self.direct_writes = False
            self._sock.close()

    def _write_all(self, frame: bytes) -> None:
        view = memoryview(frame)
        while view:
            try:
                sent = self._sock.send(view)
            except BlockingIOError:
                self._writable.poll()
                continue
            except OSError as exc:
                raise ConnectionError(str(exc)) from exc
            view = view[sent:]

    def pump(self, timeout: float | None, done=None) -> bool:
        """Dispatch what the front sent, waiting for it up to timeout seconds (and one short step at most).

        Returns False, doing nothing, when direct mode is off (the loop reads again).
        done(), checked under the lock, skips the wait when another thread already
        dispatched what the caller waits for.
        """
        step = _POLL_STEP_S if timeout is None else min(timeout, _POLL_STEP_S)
        with self.lock:
            if not self.direct:
                return False
            if done is None or not done():
                self._pump(step)
            return True

    def read_ready(self) -> None:
        """Dispatch what already waits in the socket, now, on the loop's thread (direct mode off).

        The loop would read it at its next poll, but not necessarily all sockets in the same turn:
        a caller about to act on what every peer has sent (worker_merge.py) reads it first. The end
        of the connection is left to the transport, which sees it too.
        """
        with self.lock:
            if self.direct or self.closed:
                return
            while True:
                try:
                    data = self._sock.recv(_READ_SIZE)
                except (BlockingIOError, OSError):
                    return
                if not data:
                    return
                self.data_received(data)
                if len(data) < _READ_SIZE:
                    return

    def _pump(self, timeout: float) -> None:
        if self._pending:
            self._dispatch()
            return
        if self.closed:
            raise ConnectionError("channel is closed")
        try:
            data = self._sock.recv(_READ_SIZE)
        except BlockingIOError:
            if timeout <= 0:
                return
            if not self._readable.poll(max(1, int(timeout * 1000))):
                return
            try:
                data = self._sock.recv(_READ_SIZE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
        except OSError:
            data = b""
        if not data:
            self.connection_lost(None)
            raise ConnectionError("channel is closed")
        self.data_received(data)


class OneShot:
    """fn(*args) on its first call only: a send that either the loop or a pumping thread makes."""

    __slots__ = ("_fn", "_args")

    def __init__(self, fn, *args):
        self._fn = fn
        self._args = args

    def __call__(self) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            fn(*self._args)
