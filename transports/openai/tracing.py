"""Request tracing (--trace-config) for the OpenAI routes: a call is traced as an infer request is.

A call is sampled once its body names the model (kernel.observe.trace.Tracer.sample, with the
W3C traceparent of its headers in OpenTelemetry mode): its trace gets the HTTP timestamps of an
infer request (HTTP_RECV_START, HTTP_RECV_END, INFER_RESPONSE_COMPLETE when its last model
request has answered, HTTP_SEND_START, HTTP_SEND_END). Its first model request carries that
trace; each other one (the n choices and prompts of a completion, the inputs of an embeddings
call) a child trace of it, so that in OpenTelemetry mode every model span hangs under the call's
InferRequest span, and in Triton's trace files they are records with the call's `parent_id`.
Nothing here runs while tracing is off: callers look at `start_ns` first.
"""

from __future__ import annotations

import time
from typing import Optional

_now = time.monotonic_ns


def start_ns(server) -> int:
    """When the call began if tracing may sample it (0: it will not; nothing more to do)."""
    tracer = getattr(server, "tracer", None)
    return _now() if tracer is not None and tracer.active else 0


class CallTrace:
    """The trace of one sampled call and of its model requests."""

    __slots__ = ("root", "children")

    def __init__(self, root) -> None:
        self.root = root
        self.children: list = []

    @classmethod
    def sample(cls, server, model_name: str, headers, started_ns: int) -> Optional["CallTrace"]:
        tracer = server.tracer
        trace = tracer.sample(model_name, tracer.context(headers))
        if trace is None:
            return None
        trace.stamp("HTTP_RECV_START", started_ns)
        trace.stamp("HTTP_RECV_END")
        return cls(trace)

    def for_request(self, index: int):
        """The trace for the call's model request number `index`."""
        root = self.root
        if index == 0:
            return root
        child = root.child()
        if root.top_span:  # OpenTelemetry: under the call's InferRequest span, beside the first request's
            child.parent_span = root.top_span
        self.children.append(child)
        return child

    def answered(self, response) -> None:
        """The call's last model request has answered; the answer is about to be written."""
        self.root.on_response(response)
        self.root.stamp("HTTP_SEND_START")

    def finish(self) -> None:
        """The call is over: its trace is written once the models are done with it too."""
        self.root.stamp("HTTP_SEND_END")
        for child in self.children:
            child.release()
        self.children = []
        self.root.release()
