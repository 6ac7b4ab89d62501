"""Request tracing: the trace extension's settings and Triton's JSON trace files.

Settings work as in tritonserver: one global setting (its start-up values come
from --trace-config), optional per-model settings whose unspecified fields
follow the global one, every `rate`-th request of a model sampled while the
remaining `count` lasts (-1: no limit). A sampled request carries a `Trace`
that collects named timestamps (HTTP_RECV_START, REQUEST_START, QUEUE_START,
COMPUTE_START, ...) and, at TENSORS level, its input and output tensors; when
everyone holding it is done (the transport after sending the response, the
backend after reporting the compute times) it is written out.

Output follows Triton's layout: a JSON array of records
`{"id", "model_name", "model_version"[, "request_id"][, "parent_id"]}`,
`{"id", "timestamps": [{"name", "ns"}]}` and `{"id", "activity", "tensor"}`.
With log_frequency N every N traces go to `<trace_file>.<index>`; with 0 they
go to `<trace_file>` itself when the setting is replaced or the server stops.
Files are written by one background thread, never on the event loop.

Nothing here runs for an untraced request: transports look at `Tracer.active`
once per request and the core at `request.trace`.

With `--trace-config mode=opentelemetry` the same sampling and timestamps become OpenTelemetry
spans instead of file records (kernel.observe.otel, imported only in that mode): a request that
carries a W3C traceparent is then traced whatever the rate and count (as tritonserver does), and
a traced request hands its model a context (`request.trace()`) that BLS calls carry back.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from typing import Optional

import msgspec
import numpy as np

from kernel.observe.trace_settings import (
    CLEAR,
    SETTING_FIELDS,
    TraceConfig,
    TraceLevel,
    TraceUpdate,
    invalid_setting,
    level_names,
)

log = logging.getLogger("kernel.observe.trace")

# ---------------------------------------------------------------- the file writer thread


class _Writer:
    """Writes trace output on a background thread, in the order it was handed over."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None

    def put(self, job) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kernel-trace-writer", daemon=True)
            self._thread.start()
        self._queue.put(job)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                job()
            except OSError as exc:
                log.error("failed creating trace file: %s", exc)

    def join(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


class TraceFile:
    """One trace_file path: its indexed files and the file itself (an array closed at shutdown)."""

    def __init__(self, path: str, writer: _Writer):
        self.path = path
        self.writer = writer
        self.index = 0
        self._stream = None  # the open trace_file, once something went into it
        # A front of several (kernel.serve.fronts): forward(path, records, indexed) hands the
        # records to the supervisor, which writes the one file every front's traces go to.
        self.forward = None

    def save(self, records: str, indexed: bool) -> None:
        if self.forward is not None:
            self.forward(self.path, records, indexed)
            return
        if indexed:
            name = f"{self.path}.{self.index}"
            self.index += 1
            self.writer.put(lambda: _write_whole(name, "[" + records + "]"))
        else:
            self.writer.put(lambda: self._append(records))

    def _append(self, records: str) -> None:
        if self._stream is None:
            self._stream = open(self.path, "w")
            self._stream.write("[")
        else:
            self._stream.write(",")
        self._stream.write(records)
        self._stream.flush()

    def close(self) -> None:
        def finish() -> None:
            if self._stream is not None:
                self._stream.write("]")
                self._stream.close()
                self._stream = None

        self.writer.put(finish)


def _write_whole(name: str, text: str) -> None:
    # Readers never see half a file: write aside, then rename into place.
    tmp = f"{name}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, name)


# ---------------------------------------------------------------- settings


class TraceSetting:
    """One effective setting (global or a model's), with its sampling counters and unwritten traces."""

    def __init__(self, level: TraceLevel, rate: int, count: int, log_frequency: int, file: TraceFile,
                 specified: frozenset = frozenset(), otel=None):
        self.otel = otel  # kernel.observe.otel.OtelExporter in OpenTelemetry mode, else None
        self.level = level
        self.rate = rate
        self.count = count  # remaining traces to take; -1: no limit
        self.log_frequency = log_frequency
        self.file = file
        self.specified = specified  # fields set for this setting itself (not inherited)
        self.sampled = 0
        self.created = 0
        self.collected = 0
        self._buffer: list[str] = []
        self.retired = False
        if not level:
            self.reason = "tracing is disabled"
        elif rate == 0:
            self.reason = "sample rate must be non-zero"
        elif not file.path and otel is None:
            self.reason = "trace file name is not given"
        else:
            self.reason = ""

    @property
    def valid(self) -> bool:
        return not self.reason and self.count != 0

    def sample(self) -> bool:
        if self.rate == 0 or not self.valid:
            return False
        self.sampled += 1
        if self.sampled % self.rate:
            return False
        if self.count > 0:
            self.count -= 1
        self.created += 1
        return True

    def collect(self, records: str) -> None:
        """A finished trace: buffer it, and write the buffer when log_frequency or the count says so."""
        if self.retired:  # finished after its setting was replaced: write it on its own
            self.file.save(records, indexed=self.log_frequency != 0)
            return
        self._buffer.append(records)
        self.collected += 1
        if (self.count == 0 and self.collected == self.created) or (
            self.log_frequency and len(self._buffer) >= self.log_frequency
        ):
            self._flush(indexed=True)

    def _flush(self, indexed: bool) -> None:
        if self._buffer:
            text, self._buffer = ",".join(self._buffer), []
            self.file.save(text, indexed)

    def retire(self) -> None:
        """Replaced by a newer setting (or the server stops): write what is left."""
        if not self.retired:
            self.retired = True
            self._flush(indexed=self.log_frequency != 0)

    def describe(self, mode: str, otel_settings=()) -> dict:
        """The trace extension's `$trace_setting_response`, in tritonserver's field order."""
        if self.otel is not None:
            # OpenTelemetry mode: no file settings; the exporter's settings follow the mode.
            doc = {"trace_level": level_names(self.level), "trace_rate": str(self.rate),
                   "trace_count": str(self.count), "trace_mode": mode}
            for key, value in otel_settings:
                if key in doc:  # a repeated setting (resource): every value, in order
                    doc[key] = [*(doc[key] if isinstance(doc[key], list) else [doc[key]]), value]
                else:
                    doc[key] = value
            return doc
        return {
            "trace_level": level_names(self.level),
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
            "log_frequency": str(self.log_frequency),
            "trace_file": self.file.path,
            "trace_mode": mode,
        }


class Tracer:
    """The trace settings of a server (global and per model) and the traces they sample."""

    def __init__(self, config: TraceConfig = TraceConfig()):
        self.mode = config.mode
        self._writer = _Writer()
        self._files: dict[str, TraceFile] = {}
        self._forward = None  # see forward_records
        file = self._file(config.file)
        #: The OpenTelemetry exporter (mode opentelemetry), else None: nothing of OpenTelemetry is loaded.
        self.otel = None
        self._otel_settings: list = []
        if config.mode == "opentelemetry":
            from kernel.observe.otel import OtelExporter, describe_settings

            self.otel = OtelExporter(config.otel)
            self._otel_settings = describe_settings(config.otel)
        otel = self.otel
        self._default = TraceSetting(config.level, config.rate, config.count, config.log_frequency, file, otel=otel)
        self._global = TraceSetting(config.level, config.rate, config.count, config.log_frequency, file, otel=otel)
        self._models: dict[str, TraceSetting] = {}
        self._following: set[str] = set()  # models whose setting inherits some global fields
        #: Whether any setting may sample: transports look at this before anything else.
        self.active = False
        self._refresh()

    def _file(self, path: str) -> TraceFile:
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = TraceFile(path, self._writer)
            f.forward = self._forward
        return f

    def forward_records(self, forward, first_id: int, id_step: int) -> None:
        """In a front of several (kernel.serve.fronts): finished traces go to `forward(path,
        records, indexed)` instead of a file, and trace ids are first_id, first_id + id_step, ...,
        so that every front's ids stay apart in the one file."""
        global _ids
        self._forward = forward
        for f in self._files.values():
            f.forward = forward
        _ids = itertools.count(first_id, id_step)

    def save_records(self, path: str, records: str, indexed: bool) -> None:
        """Traces a front finished (forward_records), written here into `path` as this process's own."""
        self._file(path).save(records, indexed)

    def _refresh(self) -> None:
        settings = (self._global, *self._models.values())
        self.active = any(s.valid for s in settings) or (
            # OpenTelemetry: requests with a propagated context are traced even at rate 0.
            self.otel is not None and any(s.level for s in settings))

    def context(self, headers) -> Optional[tuple[str, str]]:
        """The W3C (traceparent, tracestate) of a traced request's headers or gRPC metadata in
        OpenTelemetry mode; None otherwise. Transports call it only while `active`."""
        if self.otel is None or headers is None:
            return None
        from kernel.observe.otel import header_context

        return header_context(headers)

    # ---- sampling --------------------------------------------------------------

    def sample(self, model_name: str, context: Optional[tuple[str, str]] = None) -> Optional["Trace"]:
        """A new trace for a request to `model_name` when its setting picks this one, else None.

        `context`: the request's W3C (traceparent, tracestate) (see `context`); in OpenTelemetry mode
        a valid one is traced regardless of the rate and count, and parents the request's spans.
        """
        setting = self._models.get(model_name, self._global)
        otel = setting.otel
        if otel is not None and context is not None and setting.level:
            parent = otel.parse(context)
            if parent is not None:
                return otel.start_root(Trace(next(_ids), setting), parent)
        if setting.sample():
            trace = Trace(next(_ids), setting)
            return otel.start_root(trace, None) if otel is not None else trace
        return None

    def bls_trace(self, context: str) -> Optional["Trace"]:
        """The trace of a BLS request a model made with `trace=request.trace()`: a child of the
        calling request's trace (OpenTelemetry mode), or None when the context names none."""
        otel = self.otel
        if otel is None or not context or not self.active:
            return None
        return otel.continue_trace(context, lambda: Trace(next(_ids), self._global))

    # ---- the trace extension -------------------------------------------------------

    def describe(self, model_name: str = "") -> dict:
        return self._models.get(model_name, self._global).describe(self.mode, self._otel_settings)

    def update(self, model_name: str, update: TraceUpdate) -> None:
        """Apply a trace-setting request (global when model_name is ''); raises KernelError."""
        self._update_one(model_name, update)
        if not model_name:
            # Models that inherit some fields from the global setting pick up the change.
            for name in list(self._following):
                self._update_one(name, TraceUpdate())
        self._refresh()

    def _update_one(self, model_name: str, update: TraceUpdate) -> None:
        if model_name:
            current = self._models.get(model_name)
            fallback = self._global
        else:
            current = self._global
            fallback = self._default
        values = {f: getattr(fallback, f) for f in SETTING_FIELDS}
        specified = set()
        for f in SETTING_FIELDS:
            new = getattr(update, f)
            if new is CLEAR:
                continue
            if new is not None:
                values[f] = new
                specified.add(f)
            elif current is not None and f in current.specified:
                values[f] = getattr(current, f)
                specified.add(f)
        if model_name:
            if not specified:
                old = self._models.pop(model_name, None)
                self._following.discard(model_name)
                if old is not None:
                    old.retire()
                return
            # The trace file is never set per model, so a model setting always inherits something.
            self._following.add(model_name)
        setting = TraceSetting(values["level"], values["rate"], values["count"], values["log_frequency"],
                               fallback.file, frozenset(specified), otel=self.otel)
        if not setting.valid and setting.level:
            raise invalid_setting(f"Attempting to set invalid trace setting :{setting.reason}")
        if model_name:
            self._models[model_name] = setting
        else:
            self._global = setting
        if current is not None:
            current.retire()

    async def close(self, timeout: float = 30.0) -> None:
        """Write every unwritten trace and close the trace files (server shutdown); the last spans
        of OpenTelemetry mode get at most `timeout` seconds to reach the collector."""
        import asyncio

        for s in (self._global, *self._models.values()):
            s.retire()
        for f in self._files.values():
            f.close()
        await asyncio.to_thread(self._writer.join)
        if self.otel is not None:
            await asyncio.to_thread(self.otel.close, timeout)


# ---------------------------------------------------------------- one traced request

_now = time.monotonic_ns
_ids = itertools.count(1)  # trace ids, unique in the process as tritonserver's are
_encode = msgspec.json.Encoder().encode


class Trace:
    """What is recorded for one sampled request; written when its last holder releases it.

    The transport that sampled it holds it from the start; a backend instance
    takes a hold while the request executes (see hold/release).
    """

    __slots__ = ("id", "parent_id", "setting", "model_name", "model_version", "request_id", "stamps",
                 "tensors", "holds", "root", "children",
                 # OpenTelemetry mode (kernel.observe.otel): the trace's id, this request's model span,
                 # the span that span hangs under, the top-level InferRequest span (root from a
                 # transport only), the caller's span from a traceparent, and its tracestate.
                 "trace_id", "span_id", "parent_span", "top_span", "remote_parent", "trace_state")

    def __init__(self, trace_id: int, setting: TraceSetting, parent: Optional["Trace"] = None):
        self.id = trace_id
        self.setting = setting
        self.parent_id = parent.id if parent is not None else 0
        self.root = parent.root if parent is not None else self
        self.model_name = ""
        self.model_version = 0
        self.request_id = ""
        self.stamps: list[tuple[str, int]] = []
        self.tensors: list[str] = []
        self.children: list = []  # finished child traces' records (ensemble steps), root only
        self.holds = 1
        if parent is not None and parent.span_id:  # OpenTelemetry: a step's model span hangs under its caller's
            self.trace_id = parent.trace_id
            self.span_id = setting.otel.new_span_id()
            self.parent_span = parent.span_id
            self.trace_state = parent.trace_state
        else:
            self.trace_id = self.span_id = self.parent_span = 0
            self.trace_state = ""
        self.top_span = self.remote_parent = 0

    def stamp(self, name: str, ns: int = 0) -> None:
        self.stamps.append((name, ns or _now()))

    def hold(self) -> None:
        self.holds += 1

    def release(self) -> None:
        self.holds -= 1
        if self.holds > 0:
            return
        root = self.root
        otel = self.setting.otel
        if otel is not None:  # OpenTelemetry: the whole tree is turned into spans once the root is done
            otel.live.pop(self.span_id, None)
            if root is self:
                otel.submit(self)
            else:
                root.children.append(self)
                root.release()
            return
        records = self.records()
        if root is self:
            if self.children:
                records = ",".join([r for r in (records, *self.children) if r])
            if records:
                self.setting.collect(records)
        else:
            if records:
                root.children.append(records)
            root.release()

    def child(self) -> "Trace":
        """A trace for a request this one spawns (an ensemble step), written together with its root."""
        self.root.hold()
        return Trace(next(_ids), self.setting, self)

    def context(self) -> str:
        """The trace context a model sees as `request.trace().get_context()` ('' outside OpenTelemetry
        mode); a BLS call that hands it back becomes a child of this trace (Tracer.bls_trace)."""
        otel = self.setting.otel
        return otel.context_of(self) if otel is not None else ""

    # ---- what the core records -----------------------------------------------------

    def on_submit(self, request, model, arrival_ns: int) -> None:
        """The core accepted the request for `model`."""
        self.model_name = model.name
        self.model_version = model.version
        self.request_id = request.id
        self.stamps.append(("REQUEST_START", arrival_ns))
        self.stamps.append(("QUEUE_START", _now()))
        if self.setting.level & TraceLevel.TENSORS:
            for t in request.inputs:
                self.add_tensor("TENSOR_QUEUE_INPUT", t)

    def on_response(self, response) -> None:
        """The final response reached the transport."""
        self.stamps.append(("INFER_RESPONSE_COMPLETE", _now()))
        if self.setting.level & TraceLevel.TENSORS and response.error is None:
            for t in response.outputs:
                self.add_tensor("TENSOR_BACKEND_OUTPUT", t)

    def add_tensor(self, activity: str, tensor) -> None:
        try:
            data = _tensor_data(tensor)
        except Exception:  # noqa: BLE001 - a tensor that cannot be shown must not fail the request
            data = ""
        self.tensors.append(_encode({
            "id": self.id, "activity": activity,
            "tensor": {"name": tensor.name, "data": data, "shape": ",".join(str(d) for d in tensor.shape),
                       "dtype": tensor.datatype},
        }).decode())

    def records(self) -> str:
        """This trace's records, comma-separated (the caller adds the array brackets)."""
        out: list[str] = []
        level = self.setting.level
        if level & TraceLevel.TIMESTAMPS:
            info: dict = {"id": self.id}
            if self.model_name:
                info["model_name"] = self.model_name
                info["model_version"] = self.model_version
                if self.request_id:
                    info["request_id"] = self.request_id
                if self.parent_id:
                    info["parent_id"] = self.parent_id
            info_json = _encode(info).decode()
            placed = False
            for name, ns in sorted(self.stamps, key=lambda s: s[1]):
                if not placed and name == "REQUEST_START":
                    out.append(info_json)
                    placed = True
                out.append(f'{{"id":{self.id},"timestamps":[{{"name":"{name}","ns":{ns}}}]}}')
            if not placed and self.model_name:
                out.insert(0, info_json)
        if level & TraceLevel.TENSORS:
            out.extend(self.tensors)
        return ",".join(out)


def _tensor_data(tensor) -> str:
    """A tensor's elements as tritonserver's trace writes them: comma-separated text."""
    dtype = tensor.datatype
    if dtype in ("FP16", "BF16"):
        return ""
    arr = tensor.as_numpy().reshape(-1)
    if dtype == "BYTES":
        return ",".join(
            '"' + (v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)) + '"' for v in arr
        )
    if dtype == "BOOL":
        return ",".join("1" if v else "0" for v in arr)
    if dtype in ("FP32", "FP64"):
        return ",".join(format(float(v), "g") for v in arr)
    return ",".join(str(int(v)) for v in np.asarray(arr))

