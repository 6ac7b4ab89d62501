"""Schedulers hand requests to model instances; `make_scheduler` picks one for a model version.

Which one a model gets follows its config, as in Triton:

- `dynamic_batching`  -> kernel.core.scheduling.dynamic.DynamicBatcher
- `sequence_batching` -> kernel.core.scheduling.sequence.SequenceBatcher
- `platform: "ensemble"` -> kernel.core.scheduling.ensemble.EnsembleScheduler
- none of these       -> DirectScheduler

Every scheduler has `enqueue(request)` (raise KernelError to refuse it),
`pending_count()` (requests not yet executing, for
nv_inference_pending_request_count) and `close()` (fail what is still queued
when the server stops).
"""

from __future__ import annotations

from kernel.core.scheduling.direct import DirectScheduler
from kernel.core.scheduling.dynamic import DynamicBatcher
from kernel.core.scheduling.ensemble import EnsembleScheduler
from kernel.core.scheduling.sequence import SequenceBatcher


def make_scheduler(core, model):
    """The scheduler a loaded model version's config asks for."""
    choice = model.config.WhichOneof("scheduling_choice")
    if choice == "ensemble_scheduling":
        return EnsembleScheduler(core, model)
    if choice == "dynamic_batching":
        return DynamicBatcher(model, model.instances)
    if choice == "sequence_batching":
        return SequenceBatcher(model, model.instances)
    return DirectScheduler(model.name, model.instances, model)


def in_flight_count(model) -> int:
    """Requests of a model version accepted and not finished: waiting in its scheduler, or handed
    to an instance and without their final response yet (a stream counts until its last response).

    For the nv_inference_inflight_request_count gauge and per-model admission limits. A direct
    scheduler over one instance (or over shared ones) hands every request to one at once, so its
    pending count is a part of the instances' in-flight requests and is not added twice. These are
    this process's requests; `BackendInstance.load` counts what every process gave an instance."""
    handed = 0
    for instance in model.instances:
        handed += instance.in_flight
    scheduler = model.scheduler
    if scheduler is None or (isinstance(scheduler, DirectScheduler) and scheduler.hands_over_all()):
        return handed
    return handed + scheduler.pending_count()


def in_flight_everywhere(model) -> int:
    """in_flight_count over the whole server, for admission limits: with several front processes an
    instance's `load` counts what every front gave it (a dynamic batcher's own queue is this
    front's; a queue with a policy is one queue, in the supervisor); in a single process,
    in_flight_count itself."""
    instances = model.instances
    if not instances or not getattr(instances[0], "shared", False):
        return in_flight_count(model)
    handed = 0
    for instance in instances:
        handed += instance.load
    scheduler = model.scheduler
    if scheduler is None or isinstance(scheduler, DirectScheduler):
        return handed
    return handed + scheduler.pending_count()
