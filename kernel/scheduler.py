"""Schedulers hand requests to model instances.

Which one a model gets follows its config, as in Triton:

- `dynamic_batching`  -> kernel.dynamic_batcher.DynamicBatcher
- `sequence_batching` -> kernel.sequence_batcher.SequenceBatcher
- `platform: "ensemble"` -> kernel.ensemble.EnsembleScheduler
- none of these       -> DirectScheduler

The direct scheduler sends each request straight to the healthy instance with
the fewest requests in flight. The worker queues what it cannot run yet, so an
instance never idles while the front process has work for it.

Every scheduler has `enqueue(request)` (raise KernelError to refuse it),
`pending_count()` (requests not yet executing, for
nv_inference_pending_request_count) and `close()` (fail what is still queued
when the server stops).
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

    def pending_count(self) -> int:
        # One request per instance is executing; the rest wait in the workers.
        return sum(max(0, inst.in_flight - 1) for inst in self.instances)

    def close(self) -> None:
        pass


def make_scheduler(core, model):
    """The scheduler a loaded model version's config asks for."""
    cfg = model.config
    choice = cfg.WhichOneof("scheduling_choice")
    if choice == "ensemble_scheduling":
        from kernel.ensemble import EnsembleScheduler

        return EnsembleScheduler(core, model)
    if choice == "dynamic_batching":
        from kernel.dynamic_batcher import DynamicBatcher

        return DynamicBatcher(model, model.instances)
    if choice == "sequence_batching":
        from kernel.sequence_batcher import SequenceBatcher

        return SequenceBatcher(model, model.instances)
    return DirectScheduler(model.name, model.instances)
