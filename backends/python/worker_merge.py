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

A model with a queue delay (max_queue_delay_microseconds, 1 ms or more) gathers before it runs a
batch that is not full: each front held its requests for the delay from their own arrival, so a
request that reached another front 100 ms later would still sit in that front's queue, where one
queue would have put it in this batch. The worker asks every front (messages.Gather, with the
room left); each front's batcher hands over what it queued, delay or not
(kernel.core.scheduling.dynamic), and answers Gathered after it on the same link. The batch runs
once every front has answered (a fraction of a millisecond when their loops are free), or after
WINDOW_S (at most the delay): what a lone batch pays on top. A shorter delay only waits its length (at most a timer tick) for the
fronts' batches: see GATHER_FROM_S.

Before deciding, the worker reads what already waits in every front's socket: the loop reads the
sockets that are ready in one poll, but not always in one turn, and an Execute read a turn late
would run alone.
"""

from __future__ import annotations

from collections import deque

from kernel.backends.python import messages
from kernel.backends.python.execution_record import Batch, LinkedBatch, execution_record


# The longest a batch waits for the fronts' answers to a Gather (see the module docstring): a front
# whose loop is busy elsewhere (a large request being read) does not hold the others' batch longer.
WINDOW_S = 0.002
# Delays shorter than this do not gather: a Gather round wakes every front for a fraction of a
# millisecond, and with so short a delay the fronts' own batches reach the worker within it anyway
# (perf_analyzer c=64 on a 100 us delay model, two fronts: ~10 % fewer requests/s when every batch
# gathered, the same batch sizes).
GATHER_FROM_S = 0.001


class Merger:
    def __init__(self, worker, max_batch_size: int, variable: frozenset, optional: frozenset,
                 delay_s: float = 0.0, preferred: int = 0):
        self.worker = worker
        self.max_batch_size = max_batch_size
        self.window_s = min(delay_s, WINDOW_S)  # 0: run at once
        self.gathers = delay_s >= GATHER_FROM_S  # the window asks the fronts (Gather), not only waits
        self.full_size = min(preferred or max_batch_size, max_batch_size)  # no waiting once this is there
        self._hold = None  # the timer of a wait for other fronts' batches
        self._waited = False  # the oldest waiting Execute has had its wait
        self._round = 0  # the last Gather sent to the fronts
        self._unanswered = 0  # fronts that have not answered it yet
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
        if self.running:
            return
        if not self.worker._inline_busy:
            # Executes that wait in the fronts' sockets join now (module docstring): two waiting in two
            # link sockets through a long execute() were read a turn apart (1 run in 4 to 20) and ran alone.
            self._scheduled = True  # (what is read submits: no second _run for it)
            try:
                self.worker.links.read_ready()
            finally:
                self._scheduled = False
        if self.running or not self.waiting:
            return
        if self.window_s and not self._waited:
            fits = self._fits()
            if fits < self.full_size:
                if self._hold is None:  # idle and not full: ask the fronts for what they queued
                    self._hold = self.worker.loop.call_later(self.window_s, self._waited_enough)
                    if self.gathers and not self.worker._inline_busy:
                        self._round += 1
                        self._unanswered = self.worker.links.gather(self._round, self.max_batch_size - fits)
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

    def gathered(self, round_: int) -> None:
        """A front answered Gather(round_): its Execute, if it had one, came before and waits here."""
        if round_ != self._round or self._hold is None:
            return  # (an earlier round's, answered after its wait ended)
        self._unanswered -= 1
        if self._unanswered <= 0:
            self._hold.cancel()
            self._end_wait()
            self._schedule()  # (run from the loop, never from inside _run's reading)

    def _waited_enough(self) -> None:
        self._end_wait()
        self._run()

    def _end_wait(self) -> None:
        """The window is over (every front answered, or its time is up): the batch may run."""
        self._hold = None
        self._unanswered = 0
        self._waited = True

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
