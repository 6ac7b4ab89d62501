"""When the responses of a ModelStreamInfer call leave, on Kernel's own HTTP/2 server
(--grpc-stream-write-interval-ms).

Mixed into native_server.GrpcConnection, which owns `_flush_session(s)` (the write of what the
call's session holds) and whose streams carry `flush_scheduled`, `flush_timer` and `last_write`.

Why pace: a model can stream far faster than a gRPC client takes messages. tiny_lm sends a token
every ~30 us; tritonclient.grpc.aio spends ~67 us of CPU per message and wakes every thread of its
gRPC stack (event engine, poller, asyncio loop) at each write. Written each loop turn, a 128-token
answer took 56-74 writes at c=1 on 2 cores: the client fell behind, worked through its backlog
while the server idled, and the next request's first token ran on cold caches between the client's
wake-ups (2.13 ms against Triton generate_stream's 1.49). Paced at 1 ms it takes ~7 writes, the
first token 1.37 ms (against 1.37), tokens/s about +15 % (benchmarks/results/generative.md).

What waits: responses that come less than one interval after the call's last write, for one whole
interval, joined by all that follow meanwhile. What never waits: whatever the session marks
`urgent` (a request's first and last responses, errors, refusals, the end of the call, 256 KiB of
waiting responses: StreamSession), and a call that wrote longer than an interval ago, so a model
slower than one response per interval is never held at all. A whole interval, not what is left of
it: the loop's timers have millisecond resolution, and uvloop runs a shorter one at the next turn,
which measured as no pacing at all.
"""

from __future__ import annotations


class StreamPacingMixin:
    """For GrpcConnection: needs `loop`, `stream_write_interval` (seconds, 0: off) and `_flush_session`."""

    def _session_ready(self, s) -> None:
        """The session of call `s` has something to write."""
        if s.closed or s.trailers is not None:
            return
        session = s.session
        if s.flush_scheduled:
            if s.flush_timer is not None and session.urgent:  # held: goes now, with the urgent one
                self.unpace(s)
                self.loop.call_soon(self._flush_session, s)
            return
        s.flush_scheduled = True
        interval = self.stream_write_interval
        if interval and not session.urgent and self.loop.time() - s.last_write < interval:
            s.flush_timer = self.loop.call_later(interval, self._flush_session, s)
            return
        self.loop.call_soon(self._flush_session, s)  # with all it produces in this loop turn

    def unpace(self, s) -> None:
        """Call `s` no longer waits for its paced write: it writes now, or it has ended."""
        timer = s.flush_timer
        if timer is not None:
            s.flush_timer = None
            timer.cancel()
