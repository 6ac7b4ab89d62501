"""One batch run through a bound callable: inputs in, results out, statistics.

An Execution lives on the thread (or event loop) that runs the callable. It
turns core requests into the `Request` objects the callable takes, checks and
converts each list of results it produces, and posts finished responses to the
front loop through the instance's inbox together with the execution's timings.
"""

from __future__ import annotations

import time
import traceback
from typing import TYPE_CHECKING, Any, Optional

from kernel.core.errors import ErrorCode, KernelError
from kernel.proxy.types import Request
from kernel.core.request import InferRequest, InferResponse
from kernel.core.stats import ExecutionRecord, batch_size_of
from kernel.backends.callable.outputs import OutputError

if TYPE_CHECKING:
    from kernel.backends.callable.instance import CallableInstance

_now = time.monotonic_ns


class Delivery:
    """What goes back to the front loop: responses, and the record when the execution ended."""

    __slots__ = ("responses", "record")

    def __init__(self, responses: list[tuple[InferRequest, InferResponse]], record: Optional[ExecutionRecord]):
        self.responses = responses
        self.record = record


class Execution:
    __slots__ = ("instance", "requests", "live", "start", "input_end", "output_start", "held", "failed")

    def __init__(self, instance: "CallableInstance", requests: list[InferRequest]):
        self.instance = instance
        self.requests = requests
        self.live: list[InferRequest] = requests
        self.start = _now()
        self.input_end = 0
        self.output_start = 0
        self.held: Optional[list] = None  # non-decoupled: the one result list, sent at finish()
        self.failed: set = set()  # requests answered with an error before the end

    # ---- in -------------------------------------------------------------------------------

    def prepare(self) -> list[Request]:
        """The callable's requests; requests cancelled while queued are answered here and left out."""
        requests = self.requests
        if any(r.cancelled for r in requests):
            self.live = [r for r in requests if not r.cancelled]
            cancelled = [r for r in requests if r.cancelled]
            self._post_errors(cancelled, KernelError(ErrorCode.CANCELLED, "Request was cancelled"), final=True)
        output_names = self.instance.output_names
        proxies = []
        for r in self.live:
            data = {}
            for t in r.inputs:
                array = t.as_numpy()
                if not array.flags.writeable:
                    # Views on a request body are read-only; callables may write to their inputs.
                    array = array.copy()
                data[t.name] = array
            requested = [o.name for o in r.outputs] if r.outputs else list(output_names)
            proxies.append(Request(data=data, parameters=r.parameters, requested_output_names=requested))
        self.input_end = self.output_start = _now()
        return proxies

    def all_cancelled(self) -> bool:
        live = self.live
        return bool(live) and all(r.cancelled for r in live)

    # ---- out ------------------------------------------------------------------------------

    def on_result(self, results: Any) -> None:
        """One list of results from the callable (a return value, or one yield of a generator)."""
        if self.output_start == self.input_end:
            self.output_start = _now()
        converter = self.instance.converter
        converter.check(results, len(self.live))
        if not self.instance.decoupled:
            if self.held is not None:
                raise OutputError(
                    f"model '{converter.model_name}' is not decoupled, so its inference callable must produce "
                    "exactly one list of responses; it produced more (bind it with ModelConfig(decoupled=True) "
                    "to stream responses)"
                )
            self.held = results
            return
        self._post_results(results, final=False)

    def finish(self) -> None:
        """The callable is done: send the final responses and the execution record."""
        end_of_call = _now()
        if self.output_start == self.input_end:
            self.output_start = end_of_call
        if self.instance.decoupled:
            version = self.instance.converter.version
            name = self.instance.converter.model_name
            pairs = [(r, InferResponse(name, version, r.id, final=True)) for r in self.live if r not in self.failed]
            self._end(pairs)
            return
        if self.held is None:
            if self.live:
                self.fail(OutputError(
                    f"the inference callable of model '{self.instance.converter.model_name}' produced no responses"
                ))
            else:
                self._end([])
            return
        self._post_results(self.held, final=True)

    def fail(self, exc: BaseException) -> None:
        """The callable raised (or its results were unusable): every open request gets the error."""
        message = failure_message(self.instance.name, exc)
        self.instance.report_failure(exc, message)
        error = KernelError(ErrorCode.INTERNAL, message)
        name = self.instance.converter.model_name
        version = self.instance.converter.version
        pairs = [(r, InferResponse(name, version, r.id, error=error, final=True))
                 for r in self.live if r not in self.failed]
        self.failed.update(r for r, _ in pairs)
        self._end(pairs)

    # ---- delivery -------------------------------------------------------------------------

    def _post_results(self, results: list, final: bool) -> None:
        converter = self.instance.converter
        pairs = []
        errors = []
        for request, result in zip(self.live, results):
            if request in self.failed:
                continue
            try:
                pairs.append((request, converter.response(result, request, final)))
            except OutputError as exc:
                errors.append((request, exc))
        for request, exc in errors:
            message = failure_message(self.instance.name, exc)
            self.instance.report_failure(exc, message)
            pairs.append((request, InferResponse(converter.model_name, converter.version, request.id,
                                                 error=KernelError(ErrorCode.INTERNAL, message), final=True)))
            self.failed.add(request)
        if final:
            self._end(pairs)
        else:
            self.instance.post(Delivery(pairs, None))

    def _post_errors(self, requests: list[InferRequest], error: KernelError, final: bool) -> None:
        converter = self.instance.converter
        pairs = [(r, InferResponse(converter.model_name, converter.version, r.id, error=error, final=final))
                 for r in requests]
        self.instance.post(Delivery(pairs, None))

    def _end(self, pairs: list) -> None:
        end = _now()
        max_batch_size = self.instance.max_batch_size
        ok_request: list[int] = []
        ok_queue: list[int] = []
        fail: list[int] = []
        total = 0
        inference_count = 0
        start = self.start
        failed = self.failed
        for r in self.requests:
            bs = batch_size_of(r, max_batch_size)
            total += bs
            arrival = r.arrival_ns
            if not arrival:
                continue
            if r in failed or r.cancelled:
                fail.append(end - arrival)
            else:
                ok_request.append(end - arrival)
                ok_queue.append(max(0, start - arrival))
                inference_count += bs
        record = ExecutionRecord(total if self.live else 0, start, self.input_end or end,
                                 self.output_start or end, end, inference_count, ok_request, ok_queue, fail)
        self.instance.post(Delivery(pairs, record))


def failure_message(instance_name: str, exc: BaseException) -> str:
    """Triton's wording for a failed execution, with the callable's traceback (as PyTriton reports it)."""
    if isinstance(exc, OutputError):
        detail = f"{type(exc).__name__}: {exc}"
    else:
        # Leave out this module's own frame: the user wants to see their callable.
        tb = exc.__traceback__
        if tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_BACKEND_DIR):
            tb = tb.tb_next
        detail = "".join(traceback.format_exception(type(exc), exc, tb))
    return f"Failed to process the request(s) for model '{instance_name}', message: {detail}"


_BACKEND_DIR = __file__.rsplit("/", 1)[0]
