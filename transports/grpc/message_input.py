"""How a gRPC call's request messages are cut out of its HTTP/2 body, with as few copies as can be.

A message that arrives whole in one read is a view of that read. One spread
over reads is either joined once from views of them (small ones) or, from
DIRECT_MESSAGE bytes on, given a buffer of its own as soon as its 5-byte
prefix is known, and the connection reads the rest of it from the socket
straight into that buffer (`body_target` / `body_filled`, the hooks of
http2/data_input.py): a 16 MiB tensor is not copied at all between the kernel's
socket buffer and the backend. What partial messages may hold is bounded per
connection (`reserved`, from the declared sizes), and compressed messages are
inflated under a limit. A message that does not arrive in one read is shown to the
server's account of partial requests (`server.held_input`, kernel.core.holding): a
call whose message makes no progress for the stall timeout is cut, and while all
connections together hold more than --max-held-input-bytes new partial messages are
refused. Mixed into GrpcConnection.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from kernel.transports import inflate
from kernel.transports.grpc import codec
from kernel.transports.grpc.http2.frames import U32
from kernel.transports.grpc.http2.output import StreamHolder

# Request messages of this size or more (up to the server's max message size, checked from the
# prefix first) are read straight into a buffer of their own. (There was a 1 GiB cap: a message over
# it was gathered from views of the reads and joined on the loop, which held it ~1-2 s.)
DIRECT_MESSAGE = 256 * 1024

log = logging.getLogger("kernel.grpc")


class PartialMessage(StreamHolder):
    """A call's request message in progress as the server's account of partial requests sees it:
    the bytes received so far, and for a unary call its whole message until the client ends the
    stream (a client can stop just before that, too)."""

    __slots__ = ()

    def held_bytes(self) -> int:
        s = self.stream
        if s.closed or s.remote_closed:
            return 0
        if s.msg_view is not None:
            return 5 + s.msg_filled
        if s.parts:
            return s.have
        n = 0
        for message in s.messages or ():
            n += len(message)
        return n


class MessageInputMixin:
    """The request-message half of GrpcConnection."""

    def on_body(self, s, chunk: bytes) -> None:
        if s.inflating is not None:
            s.held_back.append(chunk)  # behind a message being inflated beside the loop
            return
        view = s.msg_view
        if view is not None:
            # A large message being read into its own buffer (see _start_message).
            filled = s.msg_filled
            k = min(len(chunk), len(view) - filled)
            view[filled : filled + k] = chunk[:k]
            self.body_filled(s, k)
            if k == len(chunk) or s.closed or s.trailers is not None:
                return
            chunk = chunk[k:]
            if s.inflating is not None:
                s.held_back.append(chunk)
                return
        if s.parts:
            s.parts.append(chunk)
            s.have += len(chunk)
            if s.have < s.need:
                return
            # The one copy of a request message spread over reads (the pieces are views of them).
            buf = memoryview(b"".join(s.parts))
            s.parts = []
            if s.reserved:
                self._release(s)
        else:
            buf = chunk
        pos = 0
        n = len(buf)
        while n - pos >= 5:
            length = U32.unpack_from(buf, pos + 1)[0]
            if length > self.max_message_size:
                # Refused from its length prefix, before any of it is buffered.
                self._too_large(s, length, self.max_message_size)
                return
            if n - pos - 5 < length:
                break
            compressed = buf[pos]
            message = buf[pos + 5 : pos + 5 + length] if (pos or n != 5 + length) else buf[5:]
            pos += 5 + length
            if compressed:
                message = self._inflate(s, message)
                if message is None:
                    if s.inflating is not None and pos < n:
                        s.held_back.append(buf[pos:])
                    return
            self._on_message(s, message)
            if s.closed or s.trailers is not None:
                return
        if pos < n:
            rest = buf[pos:]
            s.parts = [rest]
            s.have = len(rest)
            if len(rest) < 5:
                s.need = 5
                return
            s.need = need = 5 + U32.unpack_from(rest, 1)[0]
            # What the partial messages of all calls on this connection may hold: past the
            # limit a call is refused, unless it is the only one (one message may always reach
            # max_message_size).
            if self.reserved and self.reserved + need > self.max_buffered:
                s.parts = []
                self._finish(s, codec.RESOURCE_EXHAUSTED,
                             f"request messages in progress on this connection would hold more than "
                             f"{self.max_buffered} bytes")
                return
            held = self.held_input
            if held is not None and held.over_limit:
                self._cut(s, codec.UNAVAILABLE, held.refusal())
                return
            s.reserved = need
            self.reserved += need
            if need >= DIRECT_MESSAGE:
                self._start_message(s, rest, need - 5)
            if held is not None:
                holder = self.partials[s.id] = PartialMessage(self, s)
                held.watch(holder)

    def _start_message(self, s, head, length: int) -> None:
        """Give a large message its own buffer: the rest of it is read from the socket straight into
        it (body_target), so it is never copied on its way in. The buffer is numpy.empty: only the
        pages the client actually sends are ever touched, so a declared size costs no memory."""
        try:
            view = memoryview(np.empty(length, np.uint8))
        except MemoryError:
            return  # no address space for it now: it is gathered from views of the reads instead
        s.parts = []
        k = len(head) - 5
        view[:k] = head[5:]
        s.msg_view = view
        s.msg_filled = k
        s.msg_compressed = head[0]

    def body_target(self, s, limit: int):
        view = s.msg_view
        if view is None:
            return None
        filled = s.msg_filled
        return view[filled : filled + min(limit, len(view) - filled)]

    def body_filled(self, s, n: int) -> None:
        s.msg_filled += n
        view = s.msg_view
        if s.msg_filled < len(view):
            return
        s.msg_view = None
        self._release(s)
        if s.msg_compressed:
            view = self._inflate(s, view)
            if view is None:
                return
        self._on_message(s, view)

    def _release(self, s) -> None:
        """The partial message is complete or dropped: it no longer counts against the connection's
        limit (a unary call's message stays watched until the client ends the stream)."""
        self.reserved -= s.reserved
        s.reserved = 0
        if s.session is not None or s.closed:
            self.unwatch_message(s)

    def unwatch_message(self, s) -> None:
        holder = self.partials.pop(s.id, None)
        if holder is not None:
            self.held_input.unwatch(holder)

    def _inflate(self, s, message) -> Optional[bytes]:
        """The message inflated (kernel.transports.inflate: linear, never past the limit nor past
        its member limit; a few KB of gzip can expand to gigabytes), or None: the call was
        answered with an error, or the message is being inflated beside the loop (`inflating`;
        the call's later bytes and its end wait in `held_back` and `end_pending`, and its window
        is not opened again meanwhile, so what waits stays within one window)."""
        encoding = s.encoding
        if encoding != b"gzip" and encoding != b"deflate":
            self._finish(s, codec.INTERNAL, "compressed message without a grpc-encoding header")
            return None
        job = inflate.Inflation(message, encoding.decode(), self.max_decompressed_size)
        try:
            if job.run(inflate.INLINE_WORK):
                return job.result()
        except inflate.InflateError as exc:
            self._inflate_failed(s, exc)
            return None
        s.inflating = future = inflate.beside_loop(job)
        s.window_held = True
        future.add_done_callback(lambda f: self._inflated(s, f))
        return None

    def _inflated(self, s, future) -> None:
        """A message inflated beside the loop: deliver it, then what the call sent behind it."""
        if s.inflating is not future:
            return  # the call ended meanwhile (on_closed)
        s.inflating = None
        if s.closed or s.trailers is not None:
            s.held_back = []
            return
        exc = future.exception()
        if isinstance(exc, inflate.InflateError):
            self._inflate_failed(s, exc)
        elif exc is not None:
            log.error("unexpected error inflating a gRPC request message", exc_info=exc)
            self._finish(s, codec.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
        else:
            self._on_message(s, future.result())
        held, s.held_back = s.held_back, []
        for chunk in held:
            if s.closed or s.trailers is not None:
                break
            self.on_body(s, chunk)  # (back into held_back if another message goes beside the loop)
        if s.inflating is not None:
            return
        s.window_held = False
        if s.end_pending:
            s.end_pending = False
            self.on_end_stream(s)
        if s.recv_unacked and not s.closed and s not in self.granting:
            self.granting.append(s)
        self._read_done()  # start the call, grant the window it was not given meanwhile

    def _inflate_failed(self, s, exc: inflate.InflateError) -> None:
        if exc.bound == "size":
            self._too_large(s, None, self.max_decompressed_size)
        elif exc.bound is not None:
            self._finish(s, codec.RESOURCE_EXHAUSTED, f"failed to decompress the request message: {exc}")
        else:
            self._finish(s, codec.INTERNAL, f"failed to decompress the request message: {exc}")

    def _too_large(self, s, size: Optional[int], limit: int) -> None:
        # grpc C-core's status and wording for a message over the receive limit.
        if size is None:
            message = f"Received message larger than max (decompressed size over {limit})"
        else:
            message = f"Received message larger than max ({size} vs. {limit})"
        self._finish(s, codec.RESOURCE_EXHAUSTED, message)
