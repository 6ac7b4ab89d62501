"""The sequence batcher (`sequence_batching { ... }` in config.pbtxt).

A sequence is the run of requests that share a correlation ID (uint64 or
string), from the one flagged START to the one flagged END. Each live sequence
owns a *slot* of one model instance until it ends (or idles out after
max_sequence_idle_microseconds); sequences that find every slot taken wait in a
backlog. An instance executes one batch at a time, holding at most one request
per slot, so the requests of a sequence run in order, on the same instance.

The model sees the control inputs it declared (START, END, READY, CORRID) as
extra input tensors. With the direct strategy the batch position is the slot:
empty slots below the highest busy one are filled with "null" requests whose
READY is false (their responses are dropped). With the oldest strategy the
sequences whose next request is oldest are batched together.

With `iterative_sequence: true` a request without a correlation ID starts its
own sequence, and a model that releases a request with
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE gets it back in a later batch, on the
same slot, until it is released for good.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import deque
from typing import Any, Optional

import numpy as np

from kernel.core import datatypes
from kernel.core import stats as st
from kernel.core.scheduling.dynamic import _TIMER_SLACK_NS, _respond_error, input_signature_checker, log_request
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.scheduling.controls import sequence_control
from kernel.protos.model_config_pb2 import DataType, ModelSequenceBatching
from kernel.core.request import (
    REQUEST_FLAG_SEQUENCE_END,
    REQUEST_FLAG_SEQUENCE_START,
    InferRequest,
    InferTensor,
    check_correlation_id,
)

log = logging.getLogger("kernel.core.server")

_Control = ModelSequenceBatching.Control
_CORRID_INT_TYPES = {DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32, DataType.TYPE_INT32}
_RELEASE = object()  # queued in a slot: the sequence idled out, free the slot here


def _in_sequence(corr) -> bool:
    return corr != 0 and corr != ""


class _BoolControl:
    """A START/END/READY control input: one ready-made tensor per value."""

    __slots__ = ("name", "true", "false")

    def __init__(self, name: str, dtype: int, values, shape) -> None:
        self.name = name
        datatype = datatypes.config_type_to_datatype(DataType.Name(dtype))
        np_type = datatypes.datatype_to_numpy(datatype)
        self.false = InferTensor(name, datatype, shape, raw=np.array([values[0]], dtype=np_type).tobytes())
        self.true = InferTensor(name, datatype, shape, raw=np.array([values[1]], dtype=np_type).tobytes())


class _Slot:
    __slots__ = ("index", "instance", "queue", "corr")

    def __init__(self, index: int, instance: "_InstanceState") -> None:
        self.index = index
        self.instance = instance
        self.queue: deque = deque()
        self.corr: Any = None  # correlation ID of the sequence holding the slot

    def __lt__(self, other: "_Slot") -> bool:  # free slots: lowest index first, across instances
        return (self.index, self.instance.order) < (other.index, other.instance.order)


class _InstanceState:
    __slots__ = ("instance", "order", "slots", "scheduled", "timer", "timer_when")

    def __init__(self, instance, order: int, nslots: int) -> None:
        self.instance = instance
        self.order = order
        self.slots = [_Slot(i, self) for i in range(nslots)]
        self.scheduled = False
        self.timer: Optional[asyncio.TimerHandle] = None
        self.timer_when = 0.0


class _Backlog:
    __slots__ = ("corr", "requests", "expires_ns")

    def __init__(self, corr) -> None:
        self.corr = corr
        self.requests: deque = deque()
        self.expires_ns = 0


class SequenceBatcher:
    def __init__(self, model, instances: list) -> None:
        cfg = model.config
        sb = cfg.sequence_batching
        self.model = model
        self.model_name = model.name
        self.batching = cfg.max_batch_size > 0
        self.max_batch_size = max(1, cfg.max_batch_size)
        self.iterative = sb.iterative_sequence
        self.idle_ns = sb.max_sequence_idle_microseconds * 1000
        self.oldest = sb.HasField("oldest")
        if self.oldest:
            self.delay_ns = sb.oldest.max_queue_delay_microseconds * 1000
            self.preferred = frozenset(sb.oldest.preferred_batch_size)
            self.max_preferred = max(self.preferred) if self.preferred else self.max_batch_size
            nslots = sb.oldest.max_candidate_sequences or self.max_batch_size
            self.min_utilization = 0.0
        else:
            self.delay_ns = sb.direct.max_queue_delay_microseconds * 1000
            self.min_utilization = sb.direct.minimum_slot_utilization
            nslots = self.max_batch_size
        shape = (1, 1) if self.batching else (1,)
        self._shape = shape
        self.controls: list[_BoolControl] = []
        self.start = self.end = self.ready = None
        for kind, attr in (
            (_Control.CONTROL_SEQUENCE_START, "start"),
            (_Control.CONTROL_SEQUENCE_END, "end"),
            (_Control.CONTROL_SEQUENCE_READY, "ready"),
        ):
            found = sequence_control(sb, model.name, kind, boolean=True)
            if found is not None:
                setattr(self, attr, _BoolControl(found[0], found[1], found[2], shape))
        corrid = sequence_control(sb, model.name, _Control.CONTROL_SEQUENCE_CORRID, boolean=False)
        self.corrid_name = corrid[0] if corrid else None
        self.corrid_type = corrid[1] if corrid else None
        self.signature = input_signature_checker(model)
        self.instances = [_InstanceState(inst, i, nslots) for i, inst in enumerate(instances)]
        self._by_instance = {id(s.instance): s for s in self.instances}
        self._free: list[_Slot] = [slot for s in self.instances for slot in s.slots]
        heapq.heapify(self._free)
        self._seq_to_slot: dict[Any, _Slot] = {}
        self._seq_to_backlog: dict[Any, _Backlog] = {}
        self._backlogs: deque[_Backlog] = deque()
        self._last_seen: dict[Any, int] = {}
        self._reaper: Optional[asyncio.TimerHandle] = None
        self._reaper_when = 0.0
        self._auto_ids = itertools.count(1)
        self._closed = False
        self._loop = asyncio.get_event_loop()
        for inst in instances:
            inst.on_available = self._on_available

    # ---- the core's scheduler interface ----------------------------------------

    def enqueue(self, request: InferRequest) -> None:
        name = self.model_name
        if self._closed:
            raise KernelError(
                ErrorCode.UNAVAILABLE,
                "Server is stopping, scheduler for model has stopped accepting new inference requests",
            )
        if self.batching and request.inputs and request.inputs[0].shape and request.inputs[0].shape[0] > 1:
            raise KernelError(
                ErrorCode.INVALID_ARG,
                f"inference request to model '{name}' must specify batch-size 1 due to requirements of "
                "sequence batcher",
            )
        corr = check_correlation_id(request.correlation_id)  # a dict key here, 64 bits in the worker
        if not _in_sequence(corr):
            if not self.iterative:
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"inference request to model '{name}' must specify a non-zero or non-empty correlation ID",
                )
            corr = request.correlation_id = next(self._auto_ids)
            request.flags = REQUEST_FLAG_SEQUENCE_START
        self._check_corrid_type(request, corr)
        start = request.flags & REQUEST_FLAG_SEQUENCE_START
        end = request.flags & REQUEST_FLAG_SEQUENCE_END
        slot = self._seq_to_slot.get(corr)
        backlog = self._seq_to_backlog.get(corr) if slot is None else None
        if not start and slot is None and backlog is None:
            raise KernelError(
                ErrorCode.INVALID_ARG,
                f"inference request for sequence {corr} to model '{name}' must specify the START flag on the "
                "first request of the sequence",
            )
        now = st.now_ns()
        self._last_seen[corr] = now
        if self.idle_ns:
            self._arm_reaper(now + self.idle_ns, now)
        if start and (slot is not None or backlog is not None):
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                "sequence start. Previous sequence will be terminated early.", corr, name,
            )
        if self.iterative and not end:
            self._watch_iterative(request)
        if request.sched is None:
            request.sched = len(request.inputs)  # the client's inputs; controls go after them
        if slot is None and backlog is not None:
            self._to_backlog(backlog, request, end, now)
            return
        if slot is None:
            if self._free:
                slot = heapq.heappop(self._free)
                slot.corr = corr
                self._seq_to_slot[corr] = slot
            else:
                backlog = _Backlog(corr)
                self._backlogs.append(backlog)
                if not end:
                    self._seq_to_backlog[corr] = backlog
                self._to_backlog(backlog, request, end, now)
                return
        if end:
            del self._seq_to_slot[corr]
        slot.queue.append(request)
        self._kick(slot.instance)

    def pending_count(self) -> int:
        n = sum(len(slot.queue) for s in self.instances for slot in s.slots)
        return n + sum(len(b.requests) for b in self._backlogs)

    def close(self) -> None:
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
        error = KernelError(ErrorCode.UNAVAILABLE, "Server is stopping; the request was not executed")
        for s in self.instances:
            if s.timer is not None:
                s.timer.cancel()
            for slot in s.slots:
                while slot.queue:
                    r = slot.queue.popleft()
                    if r is not _RELEASE:
                        _respond_error(r, self.model, error)
        for b in self._backlogs:
            for r in b.requests:
                _respond_error(r, self.model, error)
        self._backlogs.clear()

    # ---- request bookkeeping ------------------------------------------------------

    def _check_corrid_type(self, request: InferRequest, corr) -> None:
        expected = self.corrid_type
        if expected is None:
            return
        if isinstance(corr, str):
            ok, got = expected == DataType.TYPE_STRING, "BYTES"
        else:
            ok, got = expected in _CORRID_INT_TYPES, "UINT64"
        if not ok:
            want = datatypes.config_type_to_datatype(DataType.Name(expected))
            raise KernelError(
                ErrorCode.INVALID_ARG,
                log_request(request) + f"sequence batching control '{self.corrid_name}' data-type is '{got}', "
                f"but model '{self.model_name}' expects '{want}'",
            )

    def _to_backlog(self, backlog: _Backlog, request: InferRequest, end: int, now: int) -> None:
        backlog.requests.append(request)
        if end:
            self._seq_to_backlog.pop(backlog.corr, None)
        if request.timeout_us:
            expires = now + request.timeout_us * 1000
            if not backlog.expires_ns or expires < backlog.expires_ns:
                backlog.expires_ns = expires
            self._arm_reaper(expires, now)

    def _watch_iterative(self, request: InferRequest) -> None:
        """An iterative request ends its sequence when it is released for good."""
        request.on_reschedule = self._reschedule
        deliver = request.on_response

        def on_response(response) -> None:
            if response.final:
                self._end_iterative(request)
            deliver(response)

        request.on_response = on_response

    def _reschedule(self, request: InferRequest) -> None:
        request.flags = 0
        corr = request.correlation_id
        slot = self._seq_to_slot.get(corr)
        if slot is None:  # the sequence was ended meanwhile (idle timeout)
            _respond_error(request, self.model, KernelError(
                ErrorCode.UNAVAILABLE, f"sequence {corr} of model '{self.model_name}' has ended"))
            return
        self._last_seen[corr] = st.now_ns()
        slot.queue.append(request)
        self._kick(slot.instance)

    def _end_iterative(self, request: InferRequest) -> None:
        corr = request.correlation_id
        slot = self._seq_to_slot.pop(corr, None)
        self._last_seen.pop(corr, None)
        if slot is not None and slot.corr == corr:
            if slot.queue:
                slot.queue.append(_RELEASE)
            else:
                self._release(slot)
            self._kick(slot.instance)

    def _release(self, slot: _Slot) -> None:
        """The slot's sequence ended: hand the slot to the oldest backlog, or free it."""
        while self._backlogs:
            backlog = self._backlogs.popleft()
            if not backlog.requests:
                continue
            slot.corr = backlog.corr
            slot.queue.extend(backlog.requests)
            last = backlog.requests[-1]
            if not (last.flags & REQUEST_FLAG_SEQUENCE_END):
                self._seq_to_backlog.pop(backlog.corr, None)
                self._seq_to_slot[backlog.corr] = slot
            self._kick(slot.instance)
            return
        slot.corr = None
        heapq.heappush(self._free, slot)

    # ---- batching ---------------------------------------------------------------------

    def _on_available(self, instance) -> None:
        state = self._by_instance.get(id(instance))
        if state is not None:
            self._schedule(state, 0)

    def _kick(self, state: _InstanceState) -> None:
        if not state.scheduled:
            state.scheduled = True
            self._loop.call_soon(self._run, state)

    def _run(self, state: _InstanceState) -> None:
        state.scheduled = False
        self._schedule(state, 0)

    def _on_timer(self, state: _InstanceState) -> None:
        state.timer = None
        self._schedule(state, _TIMER_SLACK_NS)

    def _schedule(self, state: _InstanceState, slack_ns: int) -> None:
        inst = state.instance
        if not inst.healthy or inst.executing > 0:
            return
        ready = []
        for slot in state.slots:
            self._settle(slot)
            if slot.queue:
                ready.append(slot)
        if not ready:
            return
        now = st.now_ns()
        if self.delay_ns:
            oldest = min(slot.queue[0].arrival_ns or now for slot in ready)
            waited = now - oldest + slack_ns
            if self.oldest:
                go = waited >= self.delay_ns or len(ready) >= self.max_preferred
            else:
                go = waited >= self.delay_ns or len(ready) / self.max_batch_size >= self.min_utilization
            if not go:
                self._arm(state, oldest + self.delay_ns - now)
                return
        batch = self._oldest_batch(ready) if self.oldest else self._direct_batch(state, ready)
        if batch:
            inst.submit(batch)

    def _settle(self, slot: _Slot) -> None:
        """Handle what sits at the front of a slot's queue before batching from it."""
        queue = slot.queue
        while queue:
            head = queue[0]
            if head is _RELEASE:
                queue.popleft()
                for r in queue:
                    _respond_error(r, self.model, KernelError(ErrorCode.CANCELLED, "Request was cancelled"))
                queue.clear()
                self._release(slot)
                continue
            if head.cancelled:
                # A cancelled request cancels the rest of its sequence.
                corr = slot.corr
                while queue:
                    r = queue.popleft()
                    if r is not _RELEASE:
                        st.fail_request(self.model.stats, r, st.CANCELED)
                        _respond_error(r, self.model, KernelError(ErrorCode.CANCELLED, "Request was cancelled"))
                if self._seq_to_slot.get(corr) is slot:
                    del self._seq_to_slot[corr]
                self._last_seen.pop(corr, None)
                self._release(slot)
                continue
            return

    def _direct_batch(self, state: _InstanceState, ready: list[_Slot]) -> list[InferRequest]:
        top = ready[-1].index
        template = ready[0].queue[0]
        batch: list[InferRequest] = []
        sig0 = self.signature(template) if self.signature is not None else None
        for slot in state.slots[: top + 1]:
            request = slot.queue[0] if slot.queue else None
            if request is not None and sig0 is not None and self.signature(request) != sig0:
                request = None
            if request is None:
                batch.append(self._null_request(template))
                continue
            slot.queue.popleft()
            batch.append(self._prepare(request))
            if request.flags & REQUEST_FLAG_SEQUENCE_END:
                self._release(slot)
        return batch

    def _oldest_batch(self, ready: list[_Slot]) -> list[InferRequest]:
        ready.sort(key=lambda s: s.queue[0].arrival_ns)
        batch = []
        sig0 = None
        for slot in ready[: self.max_batch_size]:
            request = slot.queue[0]
            if self.signature is not None:
                sig = self.signature(request)
                if sig0 is None:
                    sig0 = sig
                elif sig != sig0:
                    continue
            slot.queue.popleft()
            batch.append(self._prepare(request))
            if request.flags & REQUEST_FLAG_SEQUENCE_END:
                self._release(slot)
        return batch

    def _prepare(self, request: InferRequest) -> InferRequest:
        """Put the sequence control tensors on a request about to execute."""
        inputs = request.inputs
        del inputs[request.sched:]
        flags = request.flags
        if self.start is not None:
            inputs.append(self.start.true if flags & REQUEST_FLAG_SEQUENCE_START else self.start.false)
        if self.end is not None:
            inputs.append(self.end.true if flags & REQUEST_FLAG_SEQUENCE_END else self.end.false)
        if self.ready is not None:
            inputs.append(self.ready.true)
        if self.corrid_name is not None:
            inputs.append(self._corrid_tensor(request.correlation_id))
        return request

    def _corrid_tensor(self, corr) -> InferTensor:
        kind = self.corrid_type
        if kind == DataType.TYPE_STRING:
            arr = np.array([str(corr).encode()], dtype=np.object_).reshape(self._shape)
            return InferTensor(self.corrid_name, "BYTES", self._shape, array=arr)
        datatype = datatypes.config_type_to_datatype(DataType.Name(kind))
        value = corr if isinstance(corr, int) else 0
        raw = np.array([value], dtype=datatypes.datatype_to_numpy(datatype)).tobytes()
        return InferTensor(self.corrid_name, datatype, self._shape, raw=raw)

    def _null_request(self, template: InferRequest) -> InferRequest:
        """A not-READY filler for an empty slot; its responses go nowhere."""
        null = InferRequest(
            template.model_name, template.model_version, "", list(template.inputs[: template.sched]),
            template.outputs,
        )
        if self.start is not None:
            null.inputs.append(self.start.false)
        if self.end is not None:
            null.inputs.append(self.end.false)
        if self.ready is not None:
            null.inputs.append(self.ready.false)
        if self.corrid_name is not None:
            null.inputs.append(self._corrid_tensor(0 if self.corrid_type != DataType.TYPE_STRING else ""))
        null.on_response = _drop
        null.arrival_ns = 0  # not a client request: kept out of the statistics
        return null

    def _arm(self, state: _InstanceState, wait_ns: int) -> None:
        when = self._loop.time() + max(0, wait_ns) / 1e9
        if state.timer is not None:
            if state.timer_when <= when:
                return
            state.timer.cancel()
        state.timer_when = when
        state.timer = self._loop.call_at(when, self._on_timer, state)

    # ---- idle sequences and backlog timeouts -------------------------------------------

    def _arm_reaper(self, deadline_ns: int, now: int) -> None:
        when = self._loop.time() + max(0, deadline_ns - now) / 1e9
        if self._reaper is not None:
            if self._reaper_when <= when:
                return
            self._reaper.cancel()
        self._reaper_when = when
        self._reaper = self._loop.call_at(when, self._reap)

    def _reap(self) -> None:
        self._reaper = None
        now = st.now_ns()
        soon = now + _TIMER_SLACK_NS // 2
        nearest = 0
        if self.idle_ns:
            for corr, seen in list(self._last_seen.items()):
                deadline = seen + self.idle_ns
                if deadline > soon:
                    nearest = deadline if not nearest else min(nearest, deadline)
                    continue
                slot = self._seq_to_slot.pop(corr, None)
                if slot is not None:
                    log.debug("sequence %s of model '%s' idled out", corr, self.model_name)
                    del self._last_seen[corr]
                    if slot.queue:
                        slot.queue.append(_RELEASE)
                    else:
                        self._release(slot)
                    self._kick(slot.instance)
                elif corr in self._seq_to_backlog:
                    retry = now + 50_000_000  # still waiting for a slot: look again later
                    nearest = retry if not nearest else min(nearest, retry)
                else:
                    del self._last_seen[corr]
        expired = [b for b in self._backlogs if b.expires_ns and b.expires_ns <= soon]
        for b in self._backlogs:
            if b.expires_ns and b.expires_ns > soon:
                nearest = b.expires_ns if not nearest else min(nearest, b.expires_ns)
        if expired:
            error = KernelError(ErrorCode.UNAVAILABLE, "timeout of the corresponding sequence has been expired")
            for b in expired:
                self._backlogs.remove(b)
                if self._seq_to_backlog.get(b.corr) is b:
                    del self._seq_to_backlog[b.corr]
                for r in b.requests:
                    st.fail_request(self.model.stats, r, st.REJECTED)
                    _respond_error(r, self.model, error)
        if nearest:
            self._arm_reaper(nearest, now)


def _drop(response) -> None:
    pass
