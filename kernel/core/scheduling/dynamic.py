"""The dynamic batcher (`dynamic_batching { ... }` in config.pbtxt).

Requests wait in per-priority-level queues on the front process's event loop.
Whenever a model instance has no batch executing, the batcher looks at the
front of the queues and decides, as Triton's dynamic batcher does, whether to
send a batch now (a preferred batch size is reached, nothing more fits, or the
oldest request has waited max_queue_delay_microseconds) or to wait; waiting is
a loop timer, never a busy loop. Requests whose shapes cannot share a batch
(variable-size inputs with different shapes, different optional inputs) go in
different batches.

Queue policies: max_queue_size (enqueue refused with "Exceeds maximum queue
size"), per-request or default timeouts with REJECT ("Request timeout
expired") or DELAY (moved behind the undelayed requests of their level).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Optional

from kernel.core import stats as st
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse

# uvloop timers have millisecond resolution: a timer that fires is taken to
# have reached a deadline that is less than this much later.
_TIMER_SLACK_NS = 1_000_000

# While every instance is busy, queued requests are looked at only when one frees up: one whose
# execute never returns would keep cancelled requests queued (and counted as pending) for good. So
# while the batcher waits for an instance it drops cancelled requests this often (one timer, not
# one per request).
CANCELLED_SWEEP_S = 0.5


def log_request(request: InferRequest) -> str:
    """The prefix Triton puts on per-request error messages."""
    return f"[request id: {request.id or '<id_unknown>'}] "


class _Entry:
    __slots__ = ("request", "enqueue_ns", "deadline_ns", "batch_size", "signature")

    def __init__(self, request, enqueue_ns, deadline_ns, batch_size, signature):
        self.request = request
        self.enqueue_ns = enqueue_ns
        self.deadline_ns = deadline_ns
        self.batch_size = batch_size
        self.signature = signature


class _PolicyQueue:
    __slots__ = ("reject", "default_timeout_us", "allow_override", "max_queue_size", "queue", "delayed")

    def __init__(self, policy) -> None:
        self.reject = policy.timeout_action == 0  # ModelQueuePolicy.REJECT
        self.default_timeout_us = policy.default_timeout_microseconds
        self.allow_override = policy.allow_timeout_override
        self.max_queue_size = policy.max_queue_size
        self.queue: deque[_Entry] = deque()
        self.delayed: deque[_Entry] = deque()

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


def input_signature_checker(model):
    """A function giving the part of a request that must match for two requests
    to share a batch, or None when any two requests of the model can."""
    variable = [
        name
        for name, spec in model.inputs.items()
        if any(d == -1 for d in spec.dims) and not _ragged(model, name)
    ]
    has_optional = any(spec.optional for spec in model.inputs.values())
    if not variable and not has_optional:
        return None
    variable_set = frozenset(variable)
    batching = model.max_batch_size > 0

    def signature(request: InferRequest):
        parts = []
        for t in request.inputs:
            if t.name in variable_set:
                parts.append((t.name, t.shape[1:] if batching else t.shape))
            elif has_optional:
                parts.append((t.name, None))
        parts.sort()
        return tuple(parts)

    return signature


def _ragged(model, name: str) -> bool:
    for i in model.config.input:
        if i.name == name:
            return i.allow_ragged_batch
    return False


class DynamicBatcher:
    """Batches a model's requests across its instances."""

    #: batches an instance may have executing at once (1: like Triton's
    #: payload slots, so queued requests keep growing the next batch)
    depth = 1

    def __init__(self, model, instances: list) -> None:
        cfg = model.config
        db = cfg.dynamic_batching
        self.model = model
        self.model_name = model.name
        self.instances = instances
        self.max_batch_size = max(1, cfg.max_batch_size)
        self.batching = cfg.max_batch_size > 0
        self.preferred = frozenset(db.preferred_batch_size)
        self.max_preferred = max(self.preferred) if self.preferred else self.max_batch_size
        self.delay_ns = db.max_queue_delay_microseconds * 1000
        self.priority_levels = db.priority_levels
        self.default_level = db.default_priority_level if db.priority_levels else 0
        if db.priority_levels:
            self._levels = {
                level: _PolicyQueue(db.priority_queue_policy[level] if level in db.priority_queue_policy
                                    else db.default_queue_policy)
                for level in range(1, db.priority_levels + 1)
            }
        else:
            self._levels = {0: _PolicyQueue(db.default_queue_policy)}
        self._order = [self._levels[k] for k in sorted(self._levels)]
        self._has_timeouts = any(q.default_timeout_us for q in self._order)
        self.signature = input_signature_checker(model)
        self.preserve_ordering = db.preserve_ordering
        self._orderer = _Orderer() if self.preserve_ordering else None
        self.queued = 0
        self._scheduled = False
        self._delay_timer: Optional[asyncio.TimerHandle] = None
        self._delay_when = 0.0
        self._timeout_timer: Optional[asyncio.TimerHandle] = None
        self._timeout_when = 0.0
        self._sweep_timer: Optional[asyncio.TimerHandle] = None
        self._closed = False
        self._loop = asyncio.get_event_loop()
        for inst in instances:
            inst.on_available = self._on_available
            inst.on_gather = self._on_gather

    # ---- the core's scheduler interface ----------------------------------------

    def enqueue(self, request: InferRequest) -> None:
        if self._closed:
            raise KernelError(ErrorCode.UNAVAILABLE, f"model '{self.model_name}' is not accepting requests")
        priority = request.priority
        if not self.priority_levels:
            level = 0
        elif priority == 0 or priority > self.priority_levels:
            level = self.default_level
        else:
            level = priority
        pq = self._levels[level]
        if pq.max_queue_size and len(pq) >= pq.max_queue_size:
            raise KernelError(ErrorCode.UNAVAILABLE, log_request(request) + "Exceeds maximum queue size")
        now = st.now_ns()
        deadline = 0
        if self._has_timeouts:
            timeout_us = pq.default_timeout_us
            if pq.allow_override and request.timeout_us and request.timeout_us < timeout_us:
                timeout_us = request.timeout_us
            if timeout_us:
                deadline = now + timeout_us * 1000
        bs = request.inputs[0].shape[0] if self.batching and request.inputs and request.inputs[0].shape else 1
        sig = self.signature(request) if self.signature is not None else None
        pq.queue.append(_Entry(request, now, deadline, max(1, bs), sig))
        self.queued += 1
        if deadline:
            self._arm_timeout(deadline, now)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def pending_count(self) -> int:
        return self.queued

    def close(self) -> None:
        """Fail whatever is still queued (the server is stopping)."""
        self._closed = True
        for timer in (self._delay_timer, self._timeout_timer, self._sweep_timer):
            if timer is not None:
                timer.cancel()
        error = KernelError(ErrorCode.UNAVAILABLE, "Server is stopping; the request was not executed")
        for pq in self._order:
            for dq in (pq.queue, pq.delayed):
                while dq:
                    e = dq.popleft()
                    self.queued -= 1
                    _respond_error(e.request, self.model, error)

    # ---- scheduling -------------------------------------------------------------

    def _on_available(self, instance) -> None:
        if self.queued:
            self._schedule(0)

    def _run(self) -> None:
        self._scheduled = False
        self._schedule(0)

    def _on_delay_timer(self) -> None:
        self._delay_timer = None
        self._schedule(_TIMER_SLACK_NS)

    def _free_instance(self):
        best = None
        depth = self.depth
        for inst in self.instances:
            if inst.healthy:
                n = inst.executing
                if n < depth and (best is None or n < best.executing):
                    best = inst
        return best

    def _schedule(self, slack_ns: int) -> None:
        while self.queued:
            inst = self._free_instance()
            if inst is None:
                if self._sweep_timer is None:
                    self._sweep_timer = self._loop.call_later(CANCELLED_SWEEP_S, self._sweep_cancelled)
                return
            now = st.now_ns()
            takes, wait_ns = self._form_batch(now, slack_ns)
            if takes is None:
                if wait_ns > 0:
                    self._arm_delay(wait_ns)
                return
            inst.submit(self._take(takes))

    def _on_gather(self, inst, room: int) -> None:
        """A shared instance is about to run another process's batch with room for `room` more:
        what this process queued goes with it now, its delay waited out or not (one queue would
        have put it in that batch)."""
        if not self.queued or not inst.healthy or room <= 0:
            return
        now = st.now_ns()
        takes, _ = self._form_batch(now, self.delay_ns, min(room, self.max_batch_size))
        if takes is not None:
            inst.submit(self._take(takes))

    def _take(self, takes) -> list:
        batch = []
        for dq, k in takes:
            for _ in range(k):
                batch.append(dq.popleft().request)
        self.queued -= len(batch)
        if self._orderer is not None:
            self._orderer.track(batch)
        return batch

    def _form_batch(self, now: int, slack_ns: int, max_bs: int = 0):
        """Pick the next batch: ([(deque, count), ...], 0), or (None, ns to wait). At most max_bs
        (the model's max_batch_size when 0); a slack of the whole delay takes what there is."""
        max_bs = max_bs or self.max_batch_size
        max_pref = min(self.max_preferred, max_bs)
        preferred = self.preferred
        signature = self.signature is not None
        takes: list = []
        best_takes = None
        size = 0
        count = 0
        sig0 = None
        oldest = now
        full = False
        for pq in self._order:
            for dq in (pq.queue, pq.delayed):
                k = 0
                while k < len(dq):
                    e = dq[k]
                    if e.request.cancelled:
                        del dq[k]
                        self.queued -= 1
                        self._skip(e, st.CANCELED)
                        continue
                    if e.deadline_ns and now > e.deadline_ns:
                        del dq[k]
                        self.queued -= 1
                        self._expire(pq, e)
                        continue
                    bs = e.batch_size
                    if count:
                        if size + bs > max_pref and best_takes is None:
                            best_takes = takes + [(dq, k)]
                        if size + bs > max_bs or (signature and e.signature != sig0):
                            full = True
                            break
                    else:
                        sig0 = e.signature
                    if e.enqueue_ns < oldest:
                        oldest = e.enqueue_ns
                    k += 1
                    count += 1
                    size += bs
                    if size in preferred:
                        best_takes = takes + [(dq, k)]
                    if size >= max_bs:
                        full = True
                        break
                if k:
                    takes.append((dq, k))
                if full:
                    break
            if full:
                break
        if not count:
            return None, 0
        delay_ns = self.delay_ns
        exceeded = delay_ns > 0 and (now - oldest + slack_ns) >= delay_ns
        if best_takes is not None and not exceeded:
            return best_takes, 0
        if full or size >= max_pref or exceeded or delay_ns == 0:
            return takes, 0
        return None, oldest + delay_ns - now

    def _sweep_cancelled(self) -> None:
        """Drop the cancelled requests still queued (answered CANCELLED), then schedule as usual."""
        self._sweep_timer = None
        for pq in self._order:
            for dq in (pq.queue, pq.delayed):
                if any(e.request.cancelled for e in dq):
                    kept = deque()
                    for e in dq:
                        if e.request.cancelled:
                            self.queued -= 1
                            self._skip(e, st.CANCELED)
                        else:
                            kept.append(e)
                    dq.clear()
                    dq.extend(kept)
        self._schedule(0)

    def _arm_delay(self, wait_ns: int) -> None:
        loop = self._loop
        when = loop.time() + wait_ns / 1e9
        if self._delay_timer is not None:
            if self._delay_when <= when:
                return
            self._delay_timer.cancel()
        self._delay_when = when
        self._delay_timer = loop.call_at(when, self._on_delay_timer)

    # ---- queue policy: timeouts ------------------------------------------------------

    def _arm_timeout(self, deadline_ns: int, now: int) -> None:
        loop = self._loop
        when = loop.time() + max(0, deadline_ns - now) / 1e9
        if self._timeout_timer is not None:
            if self._timeout_when <= when:
                return
            self._timeout_timer.cancel()
        self._timeout_when = when
        self._timeout_timer = loop.call_at(when, self._on_timeout_timer)

    def _on_timeout_timer(self) -> None:
        self._timeout_timer = None
        now = st.now_ns()
        nearest = 0
        for pq in self._order:
            dq = pq.queue
            k = 0
            while k < len(dq):
                e = dq[k]
                if e.deadline_ns and now + _TIMER_SLACK_NS // 2 > e.deadline_ns:
                    del dq[k]
                    self.queued -= 1
                    self._expire(pq, e)
                    continue
                if e.deadline_ns and (nearest == 0 or e.deadline_ns < nearest):
                    nearest = e.deadline_ns
                k += 1
        if nearest:
            self._arm_timeout(nearest, now)
        if self.queued:
            self._schedule(0)

    def _expire(self, pq: _PolicyQueue, e: _Entry) -> None:
        if pq.reject:
            self._skip(e, st.REJECTED)
        else:
            e.deadline_ns = 0
            pq.delayed.append(e)
            self.queued += 1

    def _skip(self, e: _Entry, reason: str) -> None:
        request = e.request
        st.fail_request(self.model.stats, request, reason)
        if reason == st.REJECTED:
            error = KernelError(ErrorCode.UNAVAILABLE, "Request timeout expired")
        else:
            error = KernelError(ErrorCode.CANCELLED, "Request was cancelled")
        _respond_error(request, self.model, error)


class _Orderer:
    """preserve_ordering: responses leave in the order the requests were batched."""

    def __init__(self) -> None:
        self._slots: deque = deque()

    def track(self, batch: list[InferRequest]) -> None:
        for request in batch:
            slot = [request.on_response, [], False]  # callback, held responses, done
            self._slots.append(slot)
            request.on_response = self._holder(slot)

    def _holder(self, slot):
        def hold(response: InferResponse) -> None:
            slot[1].append(response)
            if response.final:
                slot[2] = True
            self._flush()

        return hold

    def _flush(self) -> None:
        slots = self._slots
        while slots:
            head = slots[0]
            held = head[1]
            if held:
                head[1] = []
                for response in held:
                    head[0](response)
            if not head[2]:
                return
            slots.popleft()


def _respond_error(request: InferRequest, model, error: KernelError) -> None:
    if request.on_response is not None:
        request.on_response(InferResponse(model.name, model.version_str, request.id, error=error))
