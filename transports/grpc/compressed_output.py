"""Compressed infer answers on Kernel's own HTTP/2 server (--grpc-infer-response-compression-level).

Mixed into native_server.GrpcConnection, whose streams carry `out_encoding` (the algorithm
compression.Chooser picked at the call's headers; None: answer as before) and `compressing`
(a message of the call is being deflated beside the loop). Calls with `out_encoding` None never
come here, so the uncompressed answer path costs nothing more than the check that sends them on.

A message small enough is compressed where it is; a larger one goes to compression.beside_loop
and the call waits for it: a ModelInfer answer is sent when its message is ready, and a
ModelStreamInfer call sends nothing after it (its later messages wait in the session's outbox,
so the order of the answers is kept) until it is ready. A call that ends meanwhile (the client
reset it, its deadline passed, the connection dropped) drops the result when it comes.
"""

from __future__ import annotations

import logging

from kernel.transports.grpc import codec, compression
from kernel.transports.grpc.http2.frames import FLAG_END_HEADERS, HEADERS, frame
from kernel.transports.grpc.wire import COMPRESSED_RESPONSE_HEADERS, TRAILERS_OK

log = logging.getLogger("kernel.grpc")


class CompressedOutputMixin:
    """The compressed answers of a GrpcConnection's calls."""

    def reply_compressed(self, s, parts: list, size: int) -> None:
        """The whole answer to a ModelInfer call whose answer is compressed: headers naming the
        algorithm, the message of the `size` bytes in `parts`, OK trailers."""
        if size <= compression.INLINE_BYTES:
            chunks, n = compression.message(s.out_encoding, parts, size)
            self._send_compressed_reply(s, chunks, n)
            return
        s.compressing = True
        future = compression.beside_loop(s.out_encoding, parts, size)
        future.add_done_callback(lambda f: self._reply_ready(s, f))

    def _reply_ready(self, s, future) -> None:
        s.compressing = False
        result = self._compressed_result(s, future)
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

    def compressed_messages(self, s, outbox) -> tuple[list, int]:
        """The ModelStreamInfer messages waiting in `outbox`, compressed, in order: (chunks, bytes).

        Stops at the first message too large to compress here; it is taken from the outbox and
        deflated beside the loop, and _stream_message_ready sends it and goes on with the rest."""
        algorithm = s.out_encoding
        data: list = []
        n = 0
        while outbox:
            body = outbox.popleft()
            size = len(body)
            if size > compression.INLINE_BYTES:
                s.compressing = True
                future = compression.beside_loop(algorithm, [body], size)
                future.add_done_callback(lambda f: self._stream_message_ready(s, f))
                break
            chunks, k = compression.message(algorithm, [body], size)
            data.extend(chunks)
            n += k
        return data, n

    def _stream_message_ready(self, s, future) -> None:
        s.compressing = False
        result = self._compressed_result(s, future)
        if result is None:
            return
        chunks, n = result
        if self.send_messages(s, chunks, n):
            self._flush_session(s)  # what the session produced meanwhile, and its end

    def _compressed_result(self, s, future):
        """(chunks, size) of a message deflated beside the loop, or None when the call is over
        (or the work failed: then the call ends with INTERNAL)."""
        if s.closed or s.trailers is not None or future.cancelled():
            return None
        exc = future.exception()
        if exc is not None:
            log.error("unexpected error compressing a gRPC answer", exc_info=exc)
            self._cut(s, codec.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
            return None
        return future.result()
