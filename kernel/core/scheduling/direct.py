"""The direct scheduler: one request per execution, to the first instance that may take work."""

from __future__ import annotations

import asyncio
from collections import deque

from kernel.core.backend import BackendInstance
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest


# How often requests waiting for a free instance are checked for cancellation (see DirectScheduler).
CANCELLED_SWEEP_S = 0.5


class DirectScheduler:
    """Triton's default scheduler: one request per execution, no batching.

    With one instance, requests are written straight to its worker, which runs
    them in turn: the worker never waits for the front process between two
    requests. With several instances a request goes to an instance that is not
    executing anything; when all are busy it waits here and goes to the first
    instance that finishes, so no instance idles while requests wait. While
    requests wait, cancelled ones leave the queue every CANCELLED_SWEEP_S (an
    instance whose execute never returns would otherwise keep them for good).

    Instances that other processes feed too (`BackendInstance.shared`: several front processes
    in front of one set of workers) are never waited for here: a request goes at once to the
    least loaded healthy instance (`BackendInstance.load`, the worker's count for every front),
    and waits in that worker, as with one instance.
    """

    def __init__(self, model_name: str, instances: list[BackendInstance], model=None):
        self.model_name = model_name
        self.model = model
        self.instances = instances
        self._queue: deque[InferRequest] = deque()
        self._sweep_timer = None
        if len(instances) > 1:
            for inst in instances:
                inst.on_available = self._on_available

    def enqueue(self, request: InferRequest) -> None:
        instances = self.instances
        if len(instances) == 1:
            best = instances[0]
            if not best.healthy:
                best = None
        elif getattr(instances[0], "shared", False):
            best = None
            least = 0
            for inst in instances:
                if inst.healthy:
                    load = inst.load
                    if best is None or load < least:
                        best, least = inst, load
        else:
            best = None
            healthy = False
            for inst in instances:
                if inst.healthy:
                    healthy = True
                    if inst.executing == 0 and (best is None or inst.in_flight < best.in_flight):
                        best = inst
            if best is None and healthy:
                self._queue.append(request)
                if self._sweep_timer is None:
                    self._sweep_timer = asyncio.get_running_loop().call_later(CANCELLED_SWEEP_S, self._sweep_cancelled)
                return
        if best is None:
            raise KernelError(
                ErrorCode.UNAVAILABLE, f"no healthy instance of model '{self.model_name}' is available"
            )
        best.submit([request])

    def _on_available(self, instance: BackendInstance) -> None:
        queue = self._queue
        while queue and instance.healthy and instance.executing == 0:
            request = queue.popleft()
            if request.cancelled:
                self._cancelled(request)
                continue
            instance.submit([request])

    def _sweep_cancelled(self) -> None:
        self._sweep_timer = None
        queue = self._queue
        if any(r.cancelled for r in queue):
            waiting = [r for r in queue if not r.cancelled]
            for request in [r for r in queue if r.cancelled]:
                self._cancelled(request)
            queue.clear()
            queue.extend(waiting)
        if queue:
            self._sweep_timer = asyncio.get_running_loop().call_later(CANCELLED_SWEEP_S, self._sweep_cancelled)

    def _cancelled(self, request: InferRequest) -> None:
        from kernel.core import stats as st
        from kernel.core.request import InferResponse

        model = self.model
        if model is not None:
            st.fail_request(model.stats, request, st.CANCELED)
        if request.on_response is not None:
            version = model.version_str if model is not None else ""
            request.on_response(InferResponse(
                self.model_name, version, request.id, error=KernelError(ErrorCode.CANCELLED, "Request was cancelled")))

    def pending_count(self) -> int:
        if self.hands_over_all():
            # One request executes per instance; the rest wait in the worker.
            return sum(max(0, inst.in_flight - 1) for inst in self.instances)
        return len(self._queue)

    def hands_over_all(self) -> bool:
        """Every request goes to an instance at once (one instance, or shared ones): nothing waits
        here, so the pending requests are a part of the instances' in-flight ones."""
        return len(self.instances) == 1 or getattr(self.instances[0], "shared", False)

    def close(self) -> None:
        error = KernelError(ErrorCode.UNAVAILABLE, "Server is stopping; the request was not executed")
        from kernel.core.request import InferResponse

        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        while self._queue:
            request = self._queue.popleft()
            if request.on_response is not None:
                request.on_response(InferResponse(self.model_name, "", request.id, error=error))
