"""How DATA arrives on an HTTP/2 connection: flow control charged per frame, payload handed on per read.

A DATA frame's payload goes to its stream as views of the reads it arrives in
(`on_body`), also while the frame is still incomplete: a 1 MiB frame split over
several reads is never gathered into one buffer first, so a large request
message is copied once (when the application joins its pieces), not once per
layer. The connection's and the stream's windows are charged the whole frame
when its header arrives, and granted back (WINDOW_UPDATE) as the payload is
read, once a quarter of the window has been: the client never waits for
credit while a large message streams in. What a client may have sent and we
have not read is thus bounded by the windows we advertise
(limits.initial_window per stream and for the connection together).
Mixed into Http2Connection, whose state it uses.
"""

from __future__ import annotations

from kernel.transports.grpc.http2.frames import (
    ENHANCE_YOUR_CALM, FLAG_END_STREAM, FLAG_PADDED, FLOW_CONTROL_ERROR, PROTOCOL_ERROR, STREAM_CLOSED, U32,
    WINDOW_UPDATE, ProtocolError, frame,
)

# WINDOW_UPDATE once 1/DIVISOR of a window has been read (not at half of it): the client is
# granted more long before it could run dry, so a large message streams without stalls.
WINDOW_UPDATE_DIVISOR = 4


# Size of the buffer reads land in (one per server: each read is handled, and copied out of it
# where kept, before the next one).
RECV_BUFFER = 256 * 1024


# The most one read straight into a message takes. libuv goes on reading a socket while each read
# fills its buffer, up to 32 reads before the loop turns: with whole 1 MiB frame payloads as the
# buffers, a client streaming a large message held the loop for 30-40 ms a turn on a 2-core box.
DIRECT_READ_MAX = 256 * 1024


class DataInputMixin:
    """The DATA-reading half of Http2Connection."""

    # ---- asyncio.BufferedProtocol: reads land where they are going

    def get_buffer(self, sizehint: int):
        if self.data_left:
            s = self.data_stream
            if s is not None and not s.closed:
                target = self.body_target(s, min(self.data_left, DIRECT_READ_MAX))
                if target is not None:
                    self.direct = True
                    return target
        self.direct = False
        if self.header_next:
            # A message is being read in place and its DATA frame just ended: read only the next
            # frame's header, so that the payload behind it lands in place too.
            self.header_next = False
            return self.recv_view[:9]
        return self.recv_view

    def buffer_updated(self, nbytes: int) -> None:
        if not self.direct:
            # One copy out of the shared buffer, as a plain Protocol's read would have made.
            self.data_received(self.recv_view[:nbytes].tobytes())
            return
        self.direct = False
        if self.failed:
            return
        # A DATA payload read straight into its stream's message: no copy at all.
        self.recv_unacked += nbytes
        s = self.data_stream
        s.recv_unacked += nbytes
        self.data_left -= nbytes
        if not s.closed:
            self.body_filled(s, nbytes)
        if not self.data_left:
            self._data_done()
            self.header_next = not s.closed and self.body_target(s, 1) is not None
        self._read_done()

    def _grant_streams(self) -> None:
        """Window updates for what streams received in this read: a client sending past what it
        was granted (more than a window in one read) is caught rather than granted more."""
        granting, self.granting = self.granting, []
        for s in granting:
            if not s.closed and not s.remote_closed and s.recv_unacked and not s.window_held:
                self.write(frame(WINDOW_UPDATE, 0, s.id, U32.pack(s.recv_unacked)))
                s.recv_window += s.recv_unacked
                s.recv_unacked = 0

    def _on_data(self, stream_id: int, flags: int, buf, start: int, stop: int) -> None:
        """A DATA frame that arrived whole (a padded one always does)."""
        size = stop - start
        self._data_start(stream_id, flags, size)
        if flags & FLAG_PADDED:
            if size < 1 or buf[start] >= size:
                raise ProtocolError(PROTOCOL_ERROR, "bad padding")
            skipped = 1 + buf[start]  # the pad length and the padding: charged, read, not delivered
            self.recv_unacked += skipped
            if self.data_stream is not None:
                self.data_stream.recv_unacked += skipped
            self.data_left -= skipped
            start += 1
            stop -= skipped - 1
        if start == stop:
            if not flags & FLAG_END_STREAM and not self.idle_frames.allow():
                raise ProtocolError(ENHANCE_YOUR_CALM, "flood of empty DATA frames", b"flood")  # CVE-2019-9518
            self._data_done()
            return
        # _data_payload for a whole frame, inline (the path of every small request)
        n = stop - start
        self.recv_unacked += n
        self.data_left = 0
        s = self.data_stream
        if s is not None:
            s.recv_unacked += n
            if not s.closed:
                self.on_body(s, memoryview(buf)[start:stop])
        self._data_done()

    def _data_start(self, stream_id: int, flags: int, size: int) -> None:
        """A DATA frame's header: flow control is charged for all of it at once; its payload
        follows through `_data_payload` (to `data_stream`, or dropped when that is None)."""
        self.recv_window -= size
        if self.recv_window < 0:
            raise ProtocolError(FLOW_CONTROL_ERROR, "DATA beyond the connection's flow-control window")
        self.data_left = size
        self.data_flags = flags
        self.data_stream = None
        s = self.streams.get(stream_id)
        if s is None:
            if stream_id == 0 or stream_id > self.last_stream_id:
                raise ProtocolError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream already closed (and reset): the data is dropped, its window counted
        if s.remote_closed:
            self._stream_error(s, STREAM_CLOSED)  # DATA after END_STREAM
            return
        s.recv_window -= size
        if s.recv_window < 0:
            self._stream_error(s, FLOW_CONTROL_ERROR)
            return
        self.data_stream = s

    def _data_payload(self, buf, pos: int, end: int) -> int:
        """Hand what `buf[pos:end]` holds of the current DATA frame's payload on; returns where it stops."""
        take = self.data_left if self.data_left < end - pos else end - pos
        if not take:
            return pos
        self.recv_unacked += take  # granted again as it is read, not when the frame starts
        s = self.data_stream
        if s is not None:
            s.recv_unacked += take
            if not s.closed:
                self.on_body(s, memoryview(buf)[pos : pos + take])
        self.data_left -= take
        if not self.data_left:
            self._data_done()
        return pos + take

    def _data_done(self) -> None:
        s, self.data_stream = self.data_stream, None
        if s is None:
            return
        if self.data_flags & FLAG_END_STREAM:
            self.remote_end(s)
        elif (s.recv_unacked >= self.limits.initial_window // WINDOW_UPDATE_DIVISOR and not s.closed
              and s not in self.granting):
            self.granting.append(s)  # its WINDOW_UPDATE goes out once this read is handled
