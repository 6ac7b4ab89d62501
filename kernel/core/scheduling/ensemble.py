"""Ensembles (`platform: "ensemble"`): a pipeline of other models run by the core.

An ensemble has no instances and no backend. Each request is run as a small
dataflow: the request's inputs are the first ensemble tensors; a step is sent
to its model (through the core, like any request: its scheduler, its
instances) as soon as every tensor its input_map names exists, and the
tensors its response carries (renamed by output_map) may start later steps.
Tensors are passed along by reference, never copied: a GPU tensor a step made stays on the GPU
for the steps after it (its step request lets the intermediate outputs stay in device memory,
kernel.core.device_memory), and so does an ensemble output its client takes into a CUDA region.

A decoupled step may answer several times: each response that brings new
tensors runs the steps that consume them again, and every time all the
ensemble's outputs have new values a response goes to the client. A step that
fails makes the whole request fail with "in ensemble '<name>', <the step's
error>", once the steps still running have finished.
"""

from __future__ import annotations

from typing import Optional

from kernel.core import stats as st
from kernel.core.device_memory import device_ok
from kernel.core.scheduling.dynamic import log_request
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor, RequestedOutput


class _Step:
    __slots__ = ("index", "model_name", "model_version", "input_map", "output_map", "outputs", "intermediate")

    def __init__(self, index: int, step) -> None:
        self.index = index
        self.model_name = step.model_name
        self.model_version = str(step.model_version) if step.model_version >= 0 else ""
        self.input_map = dict(step.input_map)  # step input name -> ensemble tensor
        self.output_map = dict(step.output_map)  # step output name -> ensemble tensor
        self.outputs = [RequestedOutput(name) for name in self.output_map]
        self.intermediate: frozenset = frozenset()  # its outputs no client reads (set by the scheduler)

    def device_outputs(self, parent_device) -> Optional[frozenset]:
        """The step outputs that may stay in GPU memory: intermediate tensors, and ensemble outputs
        the client takes in device memory (`parent_device`: the ensemble request's device_outputs)."""
        names = self.intermediate
        if parent_device:
            names = names | {o for o, t in self.output_map.items() if device_ok(parent_device, t)}
        return names or None


class EnsembleScheduler:
    def __init__(self, core, model) -> None:
        self.core = core
        self.model = model
        self.name = model.name
        cfg = model.config
        self.steps = [_Step(i, s) for i, s in enumerate(cfg.ensemble_scheduling.step)]
        self.consumers: dict[str, list[_Step]] = {}
        for step in self.steps:
            for tensor in set(step.input_map.values()):
                self.consumers.setdefault(tensor, []).append(step)
        self.output_names = [o.name for o in cfg.output]
        for step in self.steps:
            step.intermediate = frozenset(o for o, t in step.output_map.items() if t not in self.output_names)
        self.decoupled = cfg.model_transaction_policy.decoupled
        self.max_batch_size = cfg.max_batch_size
        self.running = 0

    def dependencies(self) -> list[tuple[str, str]]:
        return [(s.model_name, s.model_version) for s in self.steps]

    def enqueue(self, request: InferRequest) -> None:
        _Run(self, request).start()

    def pending_count(self) -> int:
        return 0  # requests are handed to the composing models at once

    def close(self) -> None:
        pass


class _Run:
    """One ensemble request in progress."""

    __slots__ = (
        "sched", "request", "tensors", "versions", "launched", "in_flight", "step_requests",
        "emitted", "wanted", "error", "responded", "done",
    )

    def __init__(self, sched: EnsembleScheduler, request: InferRequest) -> None:
        self.sched = sched
        self.request = request
        self.tensors: dict[str, InferTensor] = {t.name: t for t in request.inputs}
        self.versions: dict[str, int] = dict.fromkeys(self.tensors, 1)
        self.launched: dict[int, tuple] = {}  # step index -> versions of its inputs when last sent
        self.in_flight = 0
        self.step_requests: list[InferRequest] = []
        self.emitted: Optional[tuple] = None
        if request.outputs:
            self.wanted = [o.name for o in request.outputs]
        else:
            self.wanted = sched.output_names
        self.error: Optional[KernelError] = None
        self.responded = False
        self.done = False

    def start(self) -> None:
        self.sched.running += 1
        self.request.add_cancel_callback(self._cancel)
        self._advance(list(self.tensors))
        self._maybe_finish()

    # ---- dataflow ------------------------------------------------------------------

    def _advance(self, changed: list[str]) -> None:
        """Send every step whose inputs are all present and one of them just changed."""
        if self.error is not None:
            return
        candidates: list[_Step] = []
        for name in changed:
            for step in self.sched.consumers.get(name, ()):
                if step not in candidates:
                    candidates.append(step)
        candidates.sort(key=lambda s: s.index)
        for step in candidates:
            sources = step.input_map
            if any(t not in self.tensors for t in sources.values()):
                continue
            stamp = tuple(self.versions[t] for t in sources.values())
            if self.launched.get(step.index) == stamp:
                continue
            self.launched[step.index] = stamp
            self._send(step)
            if self.error is not None:
                return

    def _send(self, step: _Step) -> None:
        parent = self.request
        inputs = []
        for input_name, tensor_name in step.input_map.items():
            t = self.tensors[tensor_name]
            inputs.append(InferTensor(input_name, t.datatype, t.shape, raw=t._raw, array=t._array, device=t.device))
        child = InferRequest(
            step.model_name, step.model_version, parent.id, inputs, list(step.outputs), parent.parameters,
            priority=parent.priority, timeout_us=parent.timeout_us,
            correlation_id=parent.correlation_id, flags=parent.flags,
        )
        child.device_outputs = step.device_outputs(parent.device_outputs)
        child.on_response = lambda response, step=step: self._on_step_response(step, response)
        if parent.trace is not None:  # a traced ensemble request traces its steps, as child traces
            child.trace = parent.trace.child()
            child.on_response = lambda response, step=step, child=child: self._on_traced_step_response(
                step, response, child)
        self.in_flight += 1
        self.step_requests.append(child)
        try:
            self.sched.core.submit(child)
        except KernelError as exc:
            self.in_flight -= 1
            if child.trace is not None:
                child.trace.release()
            self._fail(exc)

    def _on_traced_step_response(self, step: _Step, response: InferResponse, child: InferRequest) -> None:
        if response.final and child.trace is not None:
            trace, child.trace = child.trace, None
            trace.on_response(response)
            trace.release()
        self._on_step_response(step, response)

    def _on_step_response(self, step: _Step, response: InferResponse) -> None:
        if response.final:
            self.in_flight -= 1
        if response.error is not None:
            self._fail(response.error)
        elif response.outputs and self.error is None:
            changed = []
            for t in response.outputs:
                tensor_name = step.output_map.get(t.name)
                if tensor_name is None:
                    continue
                t.name = tensor_name
                self.tensors[tensor_name] = t
                self.versions[tensor_name] = self.versions.get(tensor_name, 0) + 1
                changed.append(tensor_name)
            self._advance(changed)
            self._emit()
        self._maybe_finish()

    def _emit(self) -> None:
        """Answer the client when every wanted output has a value it has not seen."""
        if self.error is not None or any(n not in self.tensors for n in self.wanted):
            return
        stamp = tuple(self.versions[n] for n in self.wanted)
        if stamp == self.emitted:
            return
        self.emitted = stamp
        final = self.in_flight == 0
        outputs = [self.tensors[n] for n in self.wanted]
        self._respond(InferResponse(self.sched.name, self.sched.model.version_str, self.request.id, outputs,
                                    final=final))
        if final:
            self._finished(True)

    def _maybe_finish(self) -> None:
        if self.in_flight or self.done:
            return
        sched = self.sched
        if self.error is not None:
            error = KernelError(self.error.code, f"in ensemble '{sched.name}', {self.error.message}")
            self._respond(InferResponse(sched.name, sched.model.version_str, self.request.id, error=error))
            self._finished(False)
            return
        if self.emitted is None and not sched.decoupled:
            error = KernelError(
                ErrorCode.INVALID_ARG,
                f"in ensemble '{sched.name}', {log_request(self.request)}unexpected deadlock, at least one "
                "output is not set while no more ensemble steps can be made",
            )
            self._respond(InferResponse(sched.name, sched.model.version_str, self.request.id, error=error))
            self._finished(False)
            return
        # Everything has been sent: close the stream with a bare final flag.
        self._respond(InferResponse(sched.name, sched.model.version_str, self.request.id, final=True))
        self._finished(True)

    def _fail(self, error: KernelError) -> None:
        if self.error is None:
            self.error = error

    def _cancel(self) -> None:
        for child in self.step_requests:
            child.cancel()

    def _respond(self, response: InferResponse) -> None:
        if self.responded:
            return
        if response.final:
            self.responded = True
            if self.request.trace is not None:
                self.request.trace.stamp("REQUEST_END")
        callback = self.request.on_response
        if callback is not None:
            callback(response)

    def _finished(self, success: bool) -> None:
        if self.done:
            return
        self.done = True
        self.sched.running -= 1
        stats = self.sched.model.stats
        if stats is not None:
            arrival = self.request.arrival_ns
            duration = st.now_ns() - arrival if arrival else 0
            bs = st.batch_size_of(self.request, self.sched.max_batch_size)
            stats.record_request(success, duration, bs, 0, (0, duration, 0), reason=st.OTHER)


async def wait_for_steps(core, model) -> None:
    """Hold an ensemble's load until the models it runs have loaded; fail as Triton does
    when one is missing, failed to load, or the ensembles depend on each other in a circle."""
    import asyncio

    from kernel.core.model import ModelState

    name = model.name
    steps = model.config.ensemble_scheduling.step
    needed = sorted({s.model_name for s in steps})
    waits: dict[str, list[str]] = core.__dict__.setdefault("_ensemble_waits", {})
    cycle = _find_cycle(waits, name, needed)
    if cycle:
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"circular dependency between ensembles: {name} -> ... -> {cycle} -> {name}",
        )
    waits[name] = needed
    try:
        for _ in range(3):  # let the models loading beside this one register themselves
            await asyncio.sleep(0)
        missing = [n for n in needed if n not in core.registry.entries]
        if missing:
            raise KernelError(
                ErrorCode.INVALID_ARG,
                f"ensemble {name} contains models that are not available or ambiguous: {', '.join(missing)}",
            )
        while any(core.registry.entries[n].state is ModelState.LOADING for n in needed if n in core.registry.entries):
            await asyncio.sleep(0.01)
        for step in steps:
            entry = core.registry.entries.get(step.model_name)
            ready = {v for v, m in entry.versions.items() if m.state is ModelState.READY} if entry else set()
            if not ready:
                message = f"ensemble '{name}' depends on '{step.model_name}' which has no loaded version."
                if entry is not None and entry.reason:
                    message += f" Model '{step.model_name}' loading failed with error: {entry.reason}"
                raise KernelError(ErrorCode.INVALID_ARG, message)
            if step.model_version >= 0 and step.model_version not in ready:
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"ensemble '{name}' depends on '{step.model_name}' whose required version "
                    f"{step.model_version} is not loaded.",
                )
    finally:
        waits.pop(name, None)


def _find_cycle(waits: dict[str, list[str]], start: str, needed: list[str]) -> Optional[str]:
    """The ensemble waiting (directly or not) on `start`, if `start` waiting on `needed` closes a circle."""
    stack = [(n, start) for n in needed]
    seen = set()
    while stack:
        node, via = stack.pop()
        if node == start:
            return via
        if node in seen:
            continue
        seen.add(node)
        stack.extend((n, node) for n in waits.get(node, ()))
    return None
