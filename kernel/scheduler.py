"""Schedulers hand requests to model instances.

The direct scheduler sends each request straight to the healthy instance with
the fewest requests in flight. The worker queues what it cannot run yet, so an
instance never idles while the front process has work for it.
"""

from __future__ import annotations

from kernel.backend import BackendInstance
from kernel.errors import ErrorCode, KernelError
from kernel.request import InferRequest


class DirectScheduler:
    def __init__(self, model_name: str, instances: list[BackendInstance]):
        self.model_name = model_name
        self.instances = instances

    def enqueue(self, request: InferRequest) -> None:
        instances = self.instances
        if len(instances) == 1:
            best = instances[0]
            if not best.healthy:
                best = None
        else:
            best = None
            for inst in instances:
                if inst.healthy and (best is None or inst.in_flight < best.in_flight):
                    best = inst
        if best is None:
            raise KernelError(
                ErrorCode.UNAVAILABLE, f"no healthy instance of model '{self.model_name}' is available"
            )
        best.submit([request])
