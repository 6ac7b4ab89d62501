"""The statistics record of one Execute message (see kernel.core.stats).

The front's statistics and schedulers need, per Execute message, when input
preparation and execute began and ended and how each request fared; a Batch
collects that while the worker runs it.
"""

from __future__ import annotations

import time

import triton_python_backend_utils as pb_utils
from kernel.backends.python import messages


class Batch(list):
    """The keys of one Execute message, with what its statistics need."""

    # Slots: one Batch per Execute message, its attributes set on the request path.
    __slots__ = ("start", "input_end", "exec_start", "exec_end", "meta", "failed_early", "trace_key", "requests")

    link = None  # the worker_links.Link it came on; None: the primary (LinkedBatch has its own)
    parts = None  # merged (worker_merge.py): the Batches of the Executes it runs together

    def __init__(self, start: int):
        self.start = start
        self.input_end = 0
        self.exec_start = 0
        self.exec_end = 0
        self.meta: list[tuple[int, int]] = []  # (arrival_ns, batch size) per request handed to execute
        self.failed_early: list[int] = []  # arrival_ns of requests failed before execute
        self.trace_key = 0  # the Execute message's trace_key (echoed in its Execution record)
        self.requests: list = []

    def run(self, execute, requests):
        """On the model thread: execute, timed."""
        self.exec_start = time.monotonic_ns()
        try:
            return execute(requests)
        finally:
            self.exec_end = time.monotonic_ns()


class LinkedBatch(Batch):
    """A Batch from another front's link, or a merged one: the primary's own Batch sets neither."""

    __slots__ = ("link", "parts")

    def __init__(self, start: int, link=None, parts=None):
        super().__init__(start)
        self.link = link
        self.parts = parts


def batch_size(r: messages.Request, max_batch_size: int) -> int:
    if max_batch_size > 0 and r.inputs and r.inputs[0].shape:
        return max(1, r.inputs[0].shape[0])
    return 1


def execution_record(batch: Batch, result, exc, decoupled: bool) -> messages.Execution:
    """One Execution record per Execute message, timed as it ends now."""
    end = time.monotonic_ns()
    input_end = batch.input_end or end
    exec_start = batch.exec_start or input_end
    exec_end = batch.exec_end or end
    start = exec_start - (input_end - batch.start)  # input preparation, moved up to when execute began
    meta = batch.meta
    if len(meta) == 1 and not batch.failed_early:
        # The common c=1 case, without the general path's lists and loops (same record).
        (arrival, bs), = meta
        ok = outcomes(batch, result, exc, decoupled)[0]
        if not arrival or ok is None:
            return messages.Execution(bs, start, exec_start, exec_end, end, 0, [], [], [], batch.trace_key)
        if ok is CANCELLED:
            return messages.Execution(bs, start, exec_start, exec_end, end, 0, [], [], [], batch.trace_key,
                                      cancelled_ns=[end - arrival])
        if ok:
            return messages.Execution(bs, start, exec_start, exec_end, end, bs, [end - arrival],
                                      [max(0, start - arrival)], [], batch.trace_key)
        return messages.Execution(bs, start, exec_start, exec_end, end, 0, [], [], [end - arrival], batch.trace_key)
    ok_request: list[int] = []
    ok_queue: list[int] = []
    cancelled: list[int] = []
    failed = [end - a for a in batch.failed_early]
    inference_count = 0
    total = 0
    for (arrival, bs), outcome in zip(batch.meta, outcomes(batch, result, exc, decoupled)):
        total += bs
        if not arrival or outcome is None:
            continue
        if outcome is CANCELLED:
            cancelled.append(end - arrival)
        elif outcome:
            ok_request.append(end - arrival)
            ok_queue.append(max(0, start - arrival))
            inference_count += bs
        else:
            failed.append(end - arrival)
    return messages.Execution(
        total, start, exec_start, exec_end, end, inference_count, ok_request, ok_queue, failed, batch.trace_key,
        cancelled_ns=cancelled)


# The outcome of a request its client cancelled before it ended (counted as failure reason CANCELED,
# as the core counts a request cancelled while it holds it).
CANCELLED = "cancelled"


def _cancelled(request) -> bool:
    sink = getattr(request._response_sender, "_callback", None)
    return bool(getattr(sink, "cancelled", False))


def outcomes(batch: Batch, result, exc, decoupled: bool) -> list:
    """Per request handed to execute: True succeeded, False failed, CANCELLED cancelled by its
    client while it ran (decoupled models, whose execute answers through the response sender),
    None neither (rescheduled)."""
    n = len(batch.meta)
    if exc is not None:
        return [False] * n
    if result is None:
        return [None if r._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
                else CANCELLED if _cancelled(r) else True for r in batch.requests]
    if decoupled or not isinstance(result, list) or len(result) != n:
        return [False] * n
    out = []
    for request, response in zip(batch.requests, result):
        if request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            out.append(None if response is None else False)
        else:
            # None: answered through the response sender (see Worker._finish). A response that
            # carries the model's error counts as a success, as tritonserver 2.51 counts it: the
            # execution succeeded (peer_checks: grpc-statistics-all, error_response).
            out.append(response is None or isinstance(response, pb_utils.InferenceResponse))
    return out
