"""How an HTTP/2 connection writes: coalesced output, DATA within flow-control windows, header blocks.

Frames produced in one loop iteration leave in one transport write; DATA waits
in the stream's queue while the peer's windows (or a full transport) hold it
back, and the trailers follow the last of it. Mixed into Http2Connection, whose
state (windows, queues, the transport) it uses.

A stream whose DATA has to wait is *blocked*; only then is it shown to the server's account of
held answers (kernel.core.holding, `server.held_output`), which cuts it once it has made no
progress for the stall timeout or when the server holds too much: an answer that goes out at
once costs nothing there.
"""

from __future__ import annotations

from typing import Optional

from kernel.transports.grpc.http2.frames import (
    CANCEL, CONTINUATION, DATA, FLAG_END_HEADERS, FLAG_END_STREAM, HEADERS, NO_ERROR, RST_STREAM, U32, frame,
    frame_head,
)


# DATA frames this large make a flush hand its pieces to writelines() instead of joining them.
LARGE_WRITE = 64 * 1024


class StreamHolder:
    """A stream as an account of held bytes sees it (kernel.core.holding.Holder): a subclass says
    what it holds (`held_bytes`); cutting it resets the stream (the connection's cut_stream)."""

    __slots__ = ("conn", "stream")

    def __init__(self, conn, stream):
        self.conn = conn
        self.stream = stream

    def held_bytes(self) -> int:
        raise NotImplementedError

    def cut(self, reason: str) -> None:
        if not self.stream.closed:
            self.conn.cut_stream(self.stream, reason)


class StalledStream(StreamHolder):
    """A blocked stream as the server's account of held answers sees it: its DATA waiting for window."""

    __slots__ = ()

    def held_bytes(self) -> int:
        s = self.stream
        return 0 if s.closed else s.pending_bytes


class OutputMixin:
    """The writing half of Http2Connection."""

    def send_whole(self, s, head_block: bytes, chunks: list, n: int, trailer_block: bytes) -> bool:
        """Headers, one n-byte DATA frame made of `chunks` and trailers, all in one write.

        The fast path of a small answer; False (nothing written) when a window,
        the peer's frame size or a paused transport does not allow it.
        """
        if n > self.peer_max_frame or n > self.send_window or n > s.send_window or self.paused:
            return False
        self.send_window -= n
        s.send_window -= n
        s.headers_sent = True
        sid = s.id
        self.close_stream(s)
        out = self.out
        out.append(frame(HEADERS, FLAG_END_HEADERS, sid, head_block))
        out.append(frame_head(DATA, 0, sid, n))
        out.extend(chunks)
        if n >= LARGE_WRITE:
            self.out_large = True
        out.append(frame(HEADERS, FLAG_END_STREAM | FLAG_END_HEADERS, sid, trailer_block))
        self.pings_without_data = 0
        self.sent_data = True
        if not s.remote_closed:
            out.append(frame(RST_STREAM, 0, sid, U32.pack(NO_ERROR)))
        if self.streams:
            # Other streams are in flight: their answers may finish in this same
            # loop iteration, so gather them into one write.
            if self.flush_handle is None:
                self.flush_handle = self.loop.call_soon(self.flush)
        else:
            # The only stream on the connection: answer without waiting.
            if self.flush_handle is not None:
                self.flush_handle.cancel()
            self.flush()
        return True

    def send(self, s, heads: list, data, trailers: Optional[bytes]) -> None:
        """Write header frames, queue DATA (sent within flow-control windows), then the trailers.

        `data` is one buffer or a list of them (a message's length prefix, its fields and the
        tensors' bytes as the backend handed them over): they are framed where they lie and
        never joined, so a 16 MiB output tensor is not copied on its way to the socket.
        """
        for h in heads:
            self.write(h)
        if data:
            pending = s.pending
            for part in (data if type(data) is list else (data,)):
                view = memoryview(part)
                if view.format != "B" or view.ndim != 1:
                    view = view.cast("B")
                if view.nbytes:
                    pending.append(view)
                    s.pending_bytes += view.nbytes
        if trailers is not None:
            s.trailers = trailers
        self.pings_without_data = 0
        self.sent_data = True
        self._pump(s)

    def _pump(self, s) -> None:
        """DATA frames as large as the windows and the peer's frame size allow; a frame may span
        several queued buffers (its payload is written as views of them, not copied)."""
        pending = s.pending
        out = self.out
        max_frame = self.peer_max_frame
        sent = False
        while pending:
            window = self.send_window if self.send_window < s.send_window else s.send_window
            if self.paused or window <= 0:
                blocked = self.blocked
                if s.id not in blocked:
                    self._block(s)
                elif sent:
                    # To the back of the line: the next window goes first to the streams that got
                    # none of this one, so none of them starves (and looks stalled) behind it.
                    del blocked[s.id]
                    blocked[s.id] = s
                break
            sent = True
            take = min(s.pending_bytes, window, max_frame)
            out.append(frame_head(DATA, 0, s.id, take))
            self.send_window -= take
            s.send_window -= take
            s.pending_bytes -= take
            if take >= LARGE_WRITE:
                self.out_large = True
            while take:
                item = pending[0]
                n = len(item)
                if n <= take:
                    out.append(item)
                    pending.popleft()
                    take -= n
                else:
                    out.append(item[:take])
                    pending[0] = item[take:]
                    take = 0
        if out:
            # DATA is going out: pings are welcome again. A grpc C-core client sends a PING
            # (its bandwidth probe) on receiving DATA, also DATA released by its WINDOW_UPDATEs.
            self.sent_data = True
            self.pings_without_data = 0
            if self.flush_handle is None:
                self.flush_handle = self.loop.call_soon(self.flush)
        if pending:
            return
        if self.blocked:
            self.unblock(s)
        trailers = s.trailers
        if trailers is not None and not s.closed:
            self.close_stream(s)
            self.send_headers(s.id, trailers, end_stream=True)
            self.reset_if_open(s)

    def _block(self, s) -> None:
        """s's DATA waits for window (or for the client to read what it was sent)."""
        self.blocked[s.id] = s
        held = self.held_output
        if held is not None:
            holder = self.stalled[s.id] = StalledStream(self, s)
            held.watch(holder)

    def unblock(self, s) -> None:
        """s has nothing waiting any more, or is gone."""
        if self.blocked.pop(s.id, None) is not None:
            holder = self.stalled.pop(s.id, None)
            if holder is not None:
                self.held_output.unwatch(holder)

    def held_output_bytes(self) -> int:
        """What this connection holds for its client: DATA waiting for window, and what the
        transport has not been able to hand to the socket."""
        n = 0
        for s in self.blocked.values():
            n += s.pending_bytes
        transport = self.transport
        if transport is not None:
            n += transport.get_write_buffer_size()
        return n

    def cut_stream(self, s, reason: str) -> None:
        """The server's account of held answers gave up on this stream (no progress for the
        stall timeout, or too much held): drop what it holds and reset it. The application may
        answer with a status instead (GrpcConnection does)."""
        self.abandon(s)
        self.write(frame(RST_STREAM, 0, s.id, U32.pack(CANCEL)))

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        """A header block, split into HEADERS + CONTINUATION frames of the peer's frame size."""
        flags = FLAG_END_STREAM if end_stream else 0
        max_frame = self.peer_max_frame
        if len(block) <= max_frame:
            self.write(frame(HEADERS, flags | FLAG_END_HEADERS, stream_id, block))
            return
        self.write(frame(HEADERS, flags, stream_id, block[:max_frame]))
        rest = block[max_frame:]
        while rest:
            part, rest = rest[:max_frame], rest[max_frame:]
            self.write(frame(CONTINUATION, 0 if rest else FLAG_END_HEADERS, stream_id, part))

    def reset_if_open(self, s) -> None:
        # The answer is complete; if the client is still sending, tell it to stop.
        if not s.remote_closed:
            self.write(frame(RST_STREAM, 0, s.id, U32.pack(NO_ERROR)))

    def write(self, data: bytes) -> None:
        self.out.append(data)
        if self.flush_handle is None:
            self.flush_handle = self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_handle = None
        out, self.out = self.out, []
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            if self.out_large:
                # Large DATA: handed over as the list of frame heads and views (one writev),
                # not joined into a copy first.
                self.out_large = False
                transport.writelines(out)
            else:
                transport.write(b"".join(out) if len(out) > 1 else out[0])
