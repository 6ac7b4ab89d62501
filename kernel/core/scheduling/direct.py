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
        if len(self.instances) == 1:
            # One request executes; the rest wait in the worker.
            return max(0, self.instances[0].in_flight - 1)
        return len(self._queue)

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
