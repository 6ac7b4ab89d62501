"""What Kernel's own gRPC server keeps for one call beside its HTTP/2 stream's state.

Apart from native_server.py (which drives the calls) so that the mixins that work on a call's
input (message_input.py) and compressed output (compressed_output.py) and the server share one
description of it.
"""

from __future__ import annotations

import collections
from typing import Optional

from kernel.transports.grpc.http2.connection import Stream

# The kinds of call (native_server.method_table).
UNARY = 0
INFER = 1
STREAM = 2


class GrpcStream(Stream):
    """One HTTP/2 stream = one gRPC call: what the call keeps beside the stream's HTTP/2 state."""

    __slots__ = (
        "kind", "req_type", "method", "parts", "have", "need", "messages", "request", "session", "timer",
        "encoding", "grpc_error_mode", "flush_scheduled", "trace", "started_ns", "metadata", "denied", "call",
        "reserved", "raws", "msg_view", "msg_filled", "msg_compressed", "trace_context", "out_encoding",
        "compressing", "out_queue", "compress_held", "inflating", "held_back", "end_pending",
        "flush_timer", "last_write",
    )

    def __init__(self, stream_id: int, send_window: int, recv_window: int):
        super().__init__(stream_id, send_window, recv_window)
        self.kind = UNARY
        self.req_type = None
        self.method = None
        self.parts: list = []  # pieces of an incomplete request message
        self.have = 0  # bytes in parts
        self.need = 0  # bytes parts must reach before another message can complete
        self.messages: list = []  # complete unary request messages
        self.request = None  # core request of a ModelInfer call in flight
        self.session = None  # StreamSession of a ModelStreamInfer call
        self.timer = None
        self.encoding = b""
        self.grpc_error_mode = False
        self.flush_scheduled = False
        self.trace = None  # kernel.observe.trace.Trace of a sampled ModelInfer call
        self.started_ns = 0  # when its headers arrived (only taken while tracing is on)
        self.trace_context = None  # its W3C traceparent/tracestate (only read while tracing is on)
        self.metadata = None  # client metadata of an infer call, kept only when headers are forwarded
        self.denied: Optional[str] = None  # a restricted call: the refusal, sent once its first message is read
        self.call = None  # the decoded request of a unary call, between its end of input and its start
        self.reserved = 0  # the size of its partial message, counted in the connection's `reserved`
        self.raws = None  # what codec.split_raw_inputs took out of a large ModelInfer request (SplitOff)
        self.msg_view = None  # the buffer a large request message is being read into
        self.msg_filled = 0  # bytes of it read so far
        self.msg_compressed = 0
        self.out_encoding = None  # the algorithm of its compressed answers (compression.py), or None
        self.compressing = None  # the future of a message of its answer being deflated beside the loop
        self.out_queue: collections.deque = collections.deque()  # stream messages waiting behind it
        self.compress_held = 0  # bytes of the two, counted as held output (compressed_output.py)
        self.inflating = None  # the future of a request message being inflated beside the loop
        self.held_back: list = []  # body chunks that arrived behind it (message_input._inflate)
        self.end_pending = False  # and whether the client ended its input meanwhile
        self.flush_timer = None  # a ModelStreamInfer call's paced write, while one waits (native_server.py)
        self.last_write = -1.0  # when the call last wrote (loop time)
