"""Compressed infer answers on Kernel's own HTTP/2 server (--grpc-infer-response-compression-level).

Mixed into native_server.GrpcConnection, whose streams carry `out_encoding` (the algorithm
compression.Chooser picked at the call's headers; None: answer as before), `compressing` (the
future of a message being deflated beside the loop, or None) and `out_queue` (messages of a
ModelStreamInfer call waiting behind it). Calls with `out_encoding` None never come here, so the
uncompressed answer path costs nothing more than the check that sends them on.

A message small enough is compressed where it is; a larger one goes to compression.beside_loop
and the call waits for it: a ModelInfer answer is sent when its message is ready, and a
ModelStreamInfer call sends nothing after it (its later messages wait in `out_queue`, so the
order of the answers is kept) until it is ready. A call that ends meanwhile (the client reset
it, its deadline passed, the connection dropped, it was cut) cancels the work and drops what
waited.

Every byte held this way is held for the client, as much as DATA waiting for its window (issue
31, N6: 64 x 16 MiB answers waiting to be deflated were held uncounted, ~1 GiB against a 256 MiB
bound): the message being deflated and those queued behind it count in the connection's held
output (its per-connection bound refuses an answer that would pass it, as for uncompressed
answers) and in the server's account of held answers (`server.held_output`, through a
CompressingCall holder), which refuses new work past --max-held-output-bytes and cuts the calls
that make no progress.
"""

from __future__ import annotations

import logging
from typing import Optional

from kernel.transports.grpc import codec, compression, stream_message
from kernel.transports.grpc.http2.frames import FLAG_END_HEADERS, HEADERS, frame
from kernel.transports.grpc.http2.output import StreamHolder
from kernel.transports.grpc.wire import COMPRESSED_RESPONSE_HEADERS, TRAILERS_OK

log = logging.getLogger("kernel.grpc")


class CompressingCall(StreamHolder):
    """A call's answer bytes waiting for compression, as the server's account of held answers
    sees them."""

    __slots__ = ()

    def held_bytes(self) -> int:
        s = self.stream
        return 0 if s.closed else s.compress_held


class CompressedOutputMixin:
    """The compressed answers of a GrpcConnection's calls. The connection keeps `compress_held`
    (bytes of its calls' answers waiting for compression) and `compressing_calls` (their
    holders, by stream id)."""

    def reply_compressed(self, s, parts: list, size: int) -> None:
        """The whole answer to a ModelInfer call whose answer is compressed: headers naming the
        algorithm, the message of the `size` bytes in `parts`, OK trailers."""
        if size <= compression.INLINE_BYTES:
            chunks, n = compression.message(s.out_encoding, parts, size)
            self._send_compressed_reply(s, chunks, n)
            return
        refusal = self._compressed_refusal(size + 5)
        if refusal is not None:
            # Dropped rather than held: the arena regions behind it are released now.
            self._finish(s, codec.RESOURCE_EXHAUSTED, refusal)
            return
        self._compress_beside(s, parts, size, self._reply_ready)

    def _reply_ready(self, s, future, size: int) -> None:
        result = self._compressed_result(s, future, size)
        if result is not None:
            self._send_compressed_reply(s, *result)

    def _send_compressed_reply(self, s, chunks: list, n: int) -> None:
        head = COMPRESSED_RESPONSE_HEADERS[s.out_encoding]
        if self.send_whole(s, head, chunks, n, TRAILERS_OK):
            return
        if self.blocked or self.paused:
            refusal = self._output_refusal(n)
            if refusal is not None:
                self._finish(s, codec.RESOURCE_EXHAUSTED, refusal)
                return
        s.headers_sent = True
        self.send(s, [frame(HEADERS, FLAG_END_HEADERS, s.id, head)], chunks, TRAILERS_OK)

    def compressed_messages(self, s, outbox) -> Optional[tuple[list, int]]:
        """The ModelStreamInfer messages waiting in `out_queue`, then those the session put in
        `outbox`, compressed, in order: (chunks, bytes) to send now, or None when the call was
        cut (its client holds too much unread). The first message too large to compress here
        goes beside the loop; the ones after it wait in `out_queue`, held, and
        _stream_message_ready sends it and goes on with them."""
        algorithm = s.out_encoding
        queue = s.out_queue
        data: list = []
        n = 0
        while s.compressing is None and (queue or outbox):
            held = bool(queue)
            body = queue.popleft() if held else outbox.popleft()
            size = len(body)
            if size <= compression.INLINE_BYTES:
                if held:
                    self._unhold(s, size)
                chunks, k = compression.message(algorithm, stream_message.pieces(body), size)
                data.extend(chunks)
                n += k
                continue
            if not held and not self._hold_more(s, n + size + 5):
                return None
            self._compress_beside(s, stream_message.pieces(body), size, self._stream_message_ready, held)
        while outbox:  # behind a message being deflated: held until it is sent
            body = outbox.popleft()
            if not self._hold_more(s, n + len(body) + 5):
                return None
            self._hold(s, len(body))
            queue.append(body)
        return data, n

    def _stream_message_ready(self, s, future, size: int) -> None:
        result = self._compressed_result(s, future, size)
        if result is None:
            return
        chunks, n = result
        if self.send_messages(s, chunks, n):
            self._flush_session(s)  # the messages behind it, what the session produced meanwhile, its end

    # ---- the bytes waiting for compression, in the held-output accounts -------------------

    def _compress_beside(self, s, parts: list, size: int, ready, counted: bool = False) -> None:
        """Deflate `parts` beside the loop; `ready(s, future, size)` when done. The bytes count as
        held output until then (`counted`: they already do, waiting in out_queue)."""
        if not counted:
            self._hold(s, size)
        s.compressing = future = compression.beside_loop(s.out_encoding, parts, size)
        future.add_done_callback(lambda f: ready(s, f, size))

    def _compressed_refusal(self, n: int) -> Optional[str]:
        """Why n more bytes of answer may not wait on this connection, or None (as for answers
        waiting for their window: native_server._output_refusal)."""
        if self.blocked or self.paused or self.compress_held:
            return self._output_refusal(n)
        return None

    def _hold_more(self, s, n: int) -> bool:
        """Whether the call may hold n more bytes of answer; False: it was cut instead."""
        refusal = self._compressed_refusal(n)
        if refusal is None:
            return True
        self._cut(s, codec.RESOURCE_EXHAUSTED, refusal)
        return False

    def _hold(self, s, n: int) -> None:
        s.compress_held += n
        self.compress_held += n
        held = self.held_output
        if held is not None:
            holder = self.compressing_calls.get(s.id)
            if holder is None:
                holder = self.compressing_calls[s.id] = CompressingCall(self, s)
            held.watch(holder)

    def _unhold(self, s, n: int) -> None:
        s.compress_held -= n
        self.compress_held -= n
        if not s.compress_held:
            holder = self.compressing_calls.pop(s.id, None)
            if holder is not None:
                self.held_output.unwatch(holder)

    def drop_compressed(self, s) -> None:
        """The call is over: its deflating is cancelled and nothing of it is held any more."""
        future = s.compressing
        if future is not None:
            s.compressing = None
            future.cancel()
        s.out_queue.clear()
        if s.compress_held:
            self._unhold(s, s.compress_held)

    def held_output_bytes(self) -> int:
        return super().held_output_bytes() + self.compress_held

    def _compressed_result(self, s, future, size: int):
        """(chunks, size) of a message deflated beside the loop, or None when the call is over
        (or the work failed: then the call ends with INTERNAL)."""
        if s.compressing is not future:
            return None  # the call ended meanwhile (drop_compressed)
        s.compressing = None
        self._unhold(s, size)
        if s.closed or s.trailers is not None or future.cancelled():
            return None
        exc = future.exception()
        if exc is not None:
            log.error("unexpected error compressing a gRPC answer", exc_info=exc)
            self._cut(s, codec.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
            return None
        return future.result()
