"""OpenTelemetry trace export (`--trace-config mode=opentelemetry`), as tritonserver's OpenTelemetry mode.

A sampled request becomes spans shaped as tritonserver 2.51 exports them (checked against its OTLP
output): a top-level `InferRequest` span with the transport's events (HTTP_RECV_START ...
HTTP_SEND_END, GRPC_WAITREAD_START ... GRPC_SEND_END, INFER_RESPONSE_COMPLETE); under it one span
named after the model, with events REQUEST_START, QUEUE_START, REQUEST_END and the attributes
`triton.model_name`, `triton.model_version`, `triton.trace_id`, `triton.trace_parent_id` and
`triton.request_id` (when the request has an id); and under that a `compute` span with the
COMPUTE_* events. Ensemble steps and BLS calls made with `trace=request.trace()` are model spans
under their caller's model span. Every span is of kind SERVER, in scope `triton-server`; the
resource carries `service.name=triton-inference-server` unless `resource=` settings say otherwise.
A W3C `traceparent` (and `tracestate`) on the request makes the top span a child of the caller's.

Why it is built this way:

- Nothing here is imported unless the mode is opentelemetry (kernel.observe.trace imports this
  module only then), and this module imports the OpenTelemetry SDK only when an exporter is made,
  so a server without it never loads OpenTelemetry.
- Span and trace ids are drawn when the request is sampled (the model span's id is what a BLS call
  inside the model names as its parent, across the worker-process boundary); the spans themselves
  are built from the finished trace's timestamps on a background thread and handed to the SDK's
  BatchSpanProcessor, whose own thread batches and exports them with the OTLP/HTTP exporter. The
  event loop only puts the finished trace on a queue.
- Timestamps are taken with the monotonic clock on the request path (as for Triton's trace files)
  and turned into wall-clock time with one offset measured when the exporter starts.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import threading
import time
from typing import Iterable, Optional

log = logging.getLogger("kernel.observe.trace")

DEFAULT_URL = "http://localhost:4318/v1/traces"
DEFAULT_SERVICE_NAME = "triton-inference-server"
SCOPE_NAME = "triton-server"
# bsp setting -> (the SDK's environment variable, its default)
BSP_DEFAULTS = {
    "bsp_max_export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
    "bsp_schedule_delay": ("OTEL_BSP_SCHEDULE_DELAY", 5000),
    "bsp_max_queue_size": ("OTEL_BSP_MAX_QUEUE_SIZE", 2048),
}
MODEL_EVENTS = frozenset({"REQUEST_START", "QUEUE_START", "REQUEST_END"})
COMPUTE_EVENTS = frozenset({"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"})

_HEX = frozenset("0123456789abcdef")
new_span_id = random.SystemRandom().getrandbits  # seeded by the OS: ids never repeat across forks


def _bsp_value(name: str, given: dict[str, str]) -> int:
    if name in given:
        return int(given[name])
    env, default = BSP_DEFAULTS[name]
    try:
        return int(os.environ.get(env, default))
    except ValueError:
        return default


def describe_settings(otel: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The OpenTelemetry settings as the trace extension lists them after trace_mode: those given
    (in order, repeated ones repeated), then the batch span processor's that were not given."""
    pairs = list(otel)
    given = {k for k, _ in pairs}
    return pairs + [(name, str(_bsp_value(name, {}))) for name in BSP_DEFAULTS if name not in given]


# ---------------------------------------------------------------- W3C trace context


def header_context(headers) -> Optional[tuple[str, str]]:
    """(traceparent, tracestate) from request headers or gRPC metadata ((name, value) pairs of bytes
    or str, names lower-case as HTTP/2 and the ASGI servers give them); None without a traceparent."""
    parent = state = None
    for name, value in headers:
        if name in (b"traceparent", "traceparent"):
            parent = value
        elif name in (b"tracestate", "tracestate"):
            state = value
    if parent is None:
        return None
    if isinstance(parent, bytes):
        parent = parent.decode("latin-1")
    if isinstance(state, bytes):
        state = state.decode("latin-1")
    return parent, state or ""


def parse_traceparent(value: str) -> Optional[tuple[int, int]]:
    """(trace id, parent span id) of a W3C traceparent, or None when it is not a valid one."""
    value = value.strip()
    parts = value.split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or (parts[0] == "00" and len(parts) != 4):
        return None
    version, trace_id, span_id, flags = parts[:4]
    if len(trace_id) != 32 or len(span_id) != 16 or len(flags) != 2:
        return None
    if not set(version + trace_id + span_id + flags) <= _HEX:
        return None
    t, s = int(trace_id, 16), int(span_id, 16)
    if not t or not s:
        return None
    return t, s


def context_string(trace_id: int, span_id: int, trace_state: str) -> str:
    """What `request.trace().get_context()` gives a model: the W3C context of its model span, as JSON."""
    doc = {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"}
    if trace_state:
        doc["tracestate"] = trace_state
    return json.dumps(doc, separators=(",", ":"))


def parse_context_string(text: str) -> Optional[tuple[int, int, str]]:
    """(trace id, span id, tracestate) of a context string a model handed back with a BLS call."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceparent"), str):
        return None
    ids = parse_traceparent(doc["traceparent"])
    if ids is None:
        return None
    state = doc.get("tracestate")
    return ids[0], ids[1], state if isinstance(state, str) else ""


# ---------------------------------------------------------------- export


class OtelExporter:
    """Turns finished traces into spans and exports them over OTLP/HTTP, off the event loop."""

    def __init__(self, otel: Iterable[tuple[str, str]]):
        pairs = list(otel)
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        except ImportError as exc:
            raise RuntimeError(
                "--trace-config mode=opentelemetry needs the OpenTelemetry SDK and its OTLP/HTTP exporter: "
                f"pip install 'kernel-inference-server[otel]' ({exc})"
            ) from None
        given = dict(pairs)
        url = given.get("url", DEFAULT_URL)
        attributes = {"service.name": DEFAULT_SERVICE_NAME}
        for key, value in pairs:
            if key == "resource":
                name, sep, attr = value.partition("=")
                if sep:
                    attributes[name] = attr
        # Resource.create adds the SDK's own attributes and OTEL_RESOURCE_ATTRIBUTES; ours win.
        self.resource = Resource.create(attributes)
        self.scope = InstrumentationScope(SCOPE_NAME)
        batch = _bsp_value("bsp_max_export_batch_size", given)
        queue_size = _bsp_value("bsp_max_queue_size", given)
        if batch > queue_size:
            log.warning("bsp_max_export_batch_size %d is above bsp_max_queue_size %d; exporting batches of %d",
                        batch, queue_size, queue_size)
            batch = queue_size
        self.url = url
        self.processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=url), max_queue_size=queue_size,
            schedule_delay_millis=_bsp_value("bsp_schedule_delay", given), max_export_batch_size=max(1, batch),
        )
        self.wall_offset_ns = time.time_ns() - time.monotonic_ns()
        # span id -> trace, for traces whose context a model was given (BLS calls find their caller)
        self.live: dict = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="kernel-otel-spans", daemon=True)
        self._thread.start()

    # ---- on the event loop: ids and contexts ------------------------------------------

    @staticmethod
    def new_span_id() -> int:
        return new_span_id(64) or 1

    @staticmethod
    def parse(context: tuple[str, str]) -> Optional[tuple[int, int, str]]:
        """(trace id, parent span id, tracestate) of a request's W3C headers; None when not valid."""
        ids = parse_traceparent(context[0])
        return None if ids is None else (ids[0], ids[1], context[1])

    def start_root(self, trace, parent: Optional[tuple[int, int, str]]):
        """Give a trace sampled by a transport its ids: an InferRequest span on top, under the
        caller's span when the request carried a traceparent."""
        if parent is not None:
            trace.trace_id, trace.remote_parent, trace.trace_state = parent
        else:
            trace.trace_id = new_span_id(128) or 1
        trace.top_span = new_span_id(64) or 1
        trace.span_id = new_span_id(64) or 1
        trace.parent_span = trace.top_span
        return trace

    def context_of(self, trace) -> str:
        """The context string a traced request's model gets; a BLS call naming it finds the trace here."""
        self.live[trace.span_id] = trace
        return context_string(trace.trace_id, trace.span_id, trace.trace_state)

    def continue_trace(self, context: str, new_trace):
        """The trace of a BLS call whose request carried `context`: a child of the calling request's
        trace while that is in flight, else (a context the model made up or kept) a trace of its own
        whose model span hangs under the span the context names. None for a context that is not valid."""
        parsed = parse_context_string(context)
        if parsed is None:
            return None
        trace_id, span_id, state = parsed
        caller = self.live.get(span_id)
        if caller is not None and caller.trace_id == trace_id:
            return caller.child()
        trace = new_trace()
        trace.trace_id, trace.trace_state = trace_id, state
        trace.span_id = new_span_id(64) or 1
        trace.parent_span = span_id
        return trace

    # ---- export ---------------------------------------------------------------------

    def submit(self, trace) -> None:
        """A finished trace (with its ensemble steps and BLS calls in `children`): export its spans."""
        self._queue.put(trace)

    def close(self, timeout: float) -> None:
        """Export what is left and stop, within `timeout` seconds (blocking: the caller runs it in a
        thread). The SDK's shutdown waits up to 30 s for its last export, and more while a
        collector that is down is retried (SIGTERM took 25-31 s with --exit-timeout-secs 10, issue
        31): it runs on a daemon thread of its own, and what it has not exported by then is
        dropped with a warning, so the server still stops within its exit timeout."""
        deadline = time.monotonic() + timeout
        self._queue.put(None)
        self._thread.join(timeout)
        stopping = threading.Thread(target=self.processor.shutdown, name="kernel-otel-shutdown", daemon=True)
        stopping.start()
        stopping.join(max(0.0, deadline - time.monotonic()))
        if stopping.is_alive() or self._thread.is_alive():
            log.warning("the OpenTelemetry collector at %s did not take the last spans within %.1f s; "
                        "they are dropped", self.url, timeout)

    def _run(self) -> None:
        while True:
            trace = self._queue.get()
            if trace is None:
                return
            try:
                for span in self.spans(trace):
                    self.processor.on_end(span)
            except Exception:  # noqa: BLE001 - a trace that cannot be exported must not stop the others
                log.exception("failed to build the OpenTelemetry spans of trace %s", getattr(trace, "id", "?"))

    # ---- spans -------------------------------------------------------------------

    def spans(self, root) -> list:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState

        offset = self.wall_offset_ns
        state = TraceState.from_header([root.trace_state]) if root.trace_state else TraceState()
        flags = TraceFlags(TraceFlags.SAMPLED)
        trace_id = root.trace_id

        def context(span_id: int, remote: bool = False):
            return SpanContext(trace_id, span_id, remote, flags, state)

        def span(name, span_id, parent, stamps, attributes=None, start=None, end=None):
            events = tuple(Event(n, timestamp=ns + offset) for n, ns in stamps)
            times = [ns for _, ns in stamps]
            return ReadableSpan(
                name=name, context=context(span_id), parent=parent, resource=self.resource,
                attributes=attributes, events=events, kind=SpanKind.SERVER, instrumentation_scope=self.scope,
                start_time=(start if start is not None else min(times, default=0)) + offset,
                end_time=(end if end is not None else max(times, default=0)) + offset,
            )

        out = []
        for t in (root, *root.children):
            stamps = sorted(t.stamps, key=lambda s: s[1])
            model = [s for s in stamps if s[0] in MODEL_EVENTS]
            compute = [s for s in stamps if s[0] in COMPUTE_EVENTS]
            outer = [s for s in stamps if s[0] not in MODEL_EVENTS and s[0] not in COMPUTE_EVENTS]
            if t is root and root.top_span:
                remote = context(root.remote_parent, True) if root.remote_parent else None
                out.append(span("InferRequest", root.top_span, remote, outer))
            # (a step's INFER_RESPONSE_COMPLETE is the ensemble's business: tritonserver shows none)
            if not t.model_name:
                continue
            attributes = {
                "triton.model_name": t.model_name, "triton.model_version": t.model_version,
                "triton.trace_id": t.id, "triton.trace_parent_id": t.parent_id,
            }
            if t.request_id:
                attributes["triton.request_id"] = t.request_id
            parent = context(t.parent_span, t is root and not root.top_span) if t.parent_span else None
            start = next((ns for n, ns in model if n == "REQUEST_START"), None)
            end = next((ns for n, ns in model if n == "REQUEST_END"), None)
            if end is None and stamps:
                end = stamps[-1][1]
            out.append(span(t.model_name, t.span_id, parent, model, attributes, start, end))
            if compute:
                out.append(span("compute", new_span_id(64) or 1, context(t.span_id), compute,
                                start=compute[0][1], end=compute[-1][1]))
        return out
