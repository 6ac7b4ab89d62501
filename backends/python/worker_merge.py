"""Dynamic batching across front processes: Executes that wait in the worker run as one execute().

Why: each front's dynamic batcher forms batches from its own requests only, and sends one batch
at a time per instance. With several fronts feeding one worker (worker_links.py), their batches
arrive while the worker executes another's and would then run one after the other, each as small
as one front's share of the traffic. A dynamically batched synchronous model instead gets the
Executes that wait when it is free merged into one execute() call, in arrival order, as long as
the summed batch size stays within max_batch_size and their inputs can share a batch (the same
rule the front's batcher applies: equal shapes past the batch dimension for variable-size inputs,
the same optional inputs).

Each Execute still gets its own Execution record, sent to its own front: its requests' outcomes
and times, with `merged_batch_size` (the summed batch size of the execute() call) and `lead` on
exactly one of them, so that the fronts' statistics, summed, count the call once
(kernel.core.stats.ModelStats.record_execution).

Only while the worker has links besides the primary: a single front never has two Executes of a
dynamically batched model waiting (its batcher sends the next batch once the last one ran), and
nothing changes for it.

A model with a queue delay (max_queue_delay_microseconds) waits a moment for the others when an
Execute reaches it idle and not full: each front held its requests for the delay, so fronts whose
requests came together send them within a timer tick of each other, and one queue would have
batched them. The moment is the delay's, at most WINDOW_S: what a lone batch pays on top.
"""

from __future__ import annotations

from collections import deque

from kernel.backends.python import messages
from kernel.backends.python.execution_record import Batch, LinkedBatch, execution_record


# The longest an idle worker waits for other fronts' batches (see the module docstring): two ticks of
# uvloop's millisecond timers, where the fronts' delay timers fire.
WINDOW_S = 0.002


class Merger:
    def __init__(self, worker, max_batch_size: int, variable: frozenset, optional: frozenset,
                 delay_s: float = 0.0, preferred: int = 0):
        self.worker = worker
        self.max_batch_size = max_batch_size
        self.window_s = min(delay_s, WINDOW_S)  # 0: run at once
        self.full_size = min(preferred or max_batch_size, max_batch_size)  # no waiting once this is there
        self._hold = None  # the timer of a wait for other fronts' batches
        self._waited = False  # the oldest waiting Execute has had its wait
        self._variable = variable  # inputs whose non-batch dims vary (not ragged): their shapes must match
        self._optional = optional  # optional inputs: the same ones present
        self.waiting: deque = deque()  # (Batch, signature, batch size)
        self.running = False  # a merged (or single) execute() of ours runs
        self._scheduled = False
        self.merged_calls = 0  # execute() calls that ran more than one Execute (tests, diagnostics)

    @classmethod
    def for_model(cls, worker, config: dict):
        """A Merger for a dynamically batched synchronous model; None for any other."""
        max_batch_size = int(config.get("max_batch_size", 0) or 0)
        if worker.async_execute or max_batch_size <= 0 or "dynamic_batching" not in config:
            return None
        variable, optional = set(), set()
        for spec in config.get("input", []):
            name = spec.get("name", "")
            if spec.get("optional"):
                optional.add(name)
            if any(int(d) == -1 for d in spec.get("dims", [])) and not spec.get("allow_ragged_batch"):
                variable.add(name)
        db = config.get("dynamic_batching") or {}
        delay_s = int(db.get("max_queue_delay_microseconds", 0) or 0) / 1e6
        preferred = max((int(p) for p in db.get("preferred_batch_size", []) or []), default=0)
        return cls(worker, max_batch_size, frozenset(variable), frozenset(optional), delay_s, preferred)

    def signature(self, r: messages.Request) -> tuple:
        parts = []
        for t in r.inputs:
            if t.name in self._variable:
                parts.append((t.name, tuple(t.shape[1:])))
            elif self._optional:
                parts.append((t.name, None))
        parts.sort()
        return tuple(parts)

    def submit(self, batch: Batch, first: messages.Request) -> None:
        """An Execute ready to run (its requests made): runs when the model is free, maybe with others."""
        size = sum(bs for _, bs in batch.meta)
        self.waiting.append((batch, self.signature(first), size))
        self._schedule()

    def finished(self) -> None:
        """A synchronous execute() of this worker returned (on the loop)."""
        self.running = False
        if self.waiting:
            self._schedule()

    def drop_link(self, link) -> int:
        """A link is gone: its waiting Executes never run (their sinks are forgotten already). How many."""
        before = len(self.waiting)
        self.waiting = deque(entry for entry in self.waiting if entry[0].link is not link)
        return before - len(self.waiting)

    def _schedule(self) -> None:
        if not self._scheduled and not self.running:
            self._scheduled = True
            self.worker.loop.call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        if self.running or not self.waiting:
            return
        if self.window_s and not self._waited and self._fits() < self.full_size:
            if self._hold is None:  # idle and not full: a moment for the other fronts' batches
                self._hold = self.worker.loop.call_later(self.window_s, self._waited_enough)
            return
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None
        self._waited = False
        batch, signature, size = self.waiting.popleft()
        group = [batch]
        kept = deque()
        while self.waiting:
            entry = self.waiting.popleft()
            if entry[1] == signature and size + entry[2] <= self.max_batch_size:
                group.append(entry[0])
                size += entry[2]
            else:
                kept.append(entry)
        self.waiting = kept
        if len(group) > 1:
            batch = merge(group)
            self.merged_calls += 1
        self.running = True
        worker = self.worker
        if worker._inline_busy:  # (a stretch that holds the loop: after it)
            worker.loop.call_soon(worker._execute_sync, batch.requests, batch)
        else:
            worker._execute_sync(batch.requests, batch)


    def _waited_enough(self) -> None:
        self._hold = None
        self._waited = True
        self._run()

    def _fits(self) -> int:
        """The batch size the oldest waiting Execute would run with now."""
        signature, size = self.waiting[0][1], 0
        for _, sig, n in self.waiting:
            if sig == signature and size + n <= self.max_batch_size:
                size += n
        return size


def merge(parts: list[Batch]) -> Batch:
    """One Batch running the requests of several Executes, in order; its parts keep their own records."""
    merged = LinkedBatch(min(p.start for p in parts), None, parts)
    merged.input_end = max(p.input_end for p in parts)
    for p in parts:
        merged.extend(p)
        merged.requests.extend(p.requests)
    return merged


def part_records(merged: Batch, result, exc, decoupled: bool) -> list[tuple[Batch, messages.Execution]]:
    """The Execution record of each Execute a merged execute() ran: its own requests' outcomes."""
    total = sum(bs for p in merged.parts for _, bs in p.meta)
    whole = isinstance(result, list) and len(result) == len(merged)
    out = []
    offset = 0
    for i, part in enumerate(merged.parts):
        n = len(part)
        part.exec_start, part.exec_end = merged.exec_start, merged.exec_end
        if exc is None and result is not None:
            own = result[offset:offset + n] if whole else ()  # a wrong return fails every part's requests
        else:
            own = result
        offset += n
        record = execution_record(part, own, exc, decoupled)
        record.merged_batch_size = total
        record.lead = i == 0
        out.append((part, record))
    return out
