"""A front's instances: links to the supervisor's workers, and its relay to the supervisor.

The supervisor publishes each model version with a link (two sockets) per worker instance
(hub.py); here they become the front's BackendInstances (backends/python: LinkedInstance), started
before the version serves. A relayed version (hub.Hub.relayed) gets a RelayScheduler instead: its
requests go, one at a time and at once, over this front's relay link to the supervisor's core
(relay.py), whose own scheduler does the queueing, batching and sequence keeping.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable

from kernel.backends.python.instance import WorkerFacts
from kernel.core.backend import BackendInstance, ModelSource
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest
from kernel.protos.model_config_pb2 import ModelConfig


async def attach_instances(backend, source, link_id: int, links) -> list:
    """The front's instances for `source`'s workers, connected; links: (InstanceLink, channel socket, fd socket)."""
    return await backend.linked_instances(source, [(link_id, chan, fd_sock, link.facts) for link, chan, fd_sock in links])


async def relay_instance(server, link_id: int, chan: socket.socket, fd_sock: socket.socket):
    """This front's relay to the supervisor (relay.py): a linked instance whose requests carry their model."""
    source = ModelSource(name="relay", version=0, model_dir=Path("."), version_dir=Path("."), repository=Path("."),
                         config=ModelConfig(), config_json="{}")
    facts = WorkerFacts("relay", "KIND_CPU", 0, os.getppid(), async_execute=True)
    python = server.backends["python"]
    (relay,) = await python.linked_instances(source, [(link_id, chan, fd_sock, facts)])
    relay.relay = True
    return relay


class RelayedInstance(BackendInstance):
    """What a relayed version has here instead of instances: the front's relay, seen as one
    instance that is healthy while the relay is. It counts nothing itself (the supervisor's core,
    which runs the requests, counts them), so every request is the supervisor's to account for."""

    def __init__(self, model, relay: Callable):
        self.name = f"{model.name} (relayed)"
        self._relay = relay

    @property
    def healthy(self) -> bool:
        relay = self._relay()
        return relay is not None and relay.healthy

    @property
    def in_flight(self) -> int:
        return 0

    def submit(self, requests: list[InferRequest]) -> None:
        relay = self._relay()
        if relay is None:
            raise KernelError(ErrorCode.UNAVAILABLE, "the server is starting or stopping")
        relay.submit(requests)

    async def stop(self, timeout: float) -> None:
        pass  # the relay is the front's, not this version's


class RelayScheduler:
    """The scheduler of a relayed version in a front: hands each request to the supervisor at once."""

    def __init__(self, model, instance: RelayedInstance):
        self.model = model
        self.instance = instance

    def enqueue(self, request: InferRequest) -> None:
        if not self.instance.healthy:
            raise KernelError(ErrorCode.UNAVAILABLE, f"model '{self.model.name}' cannot be reached: the server "
                                                     "is starting or stopping")
        request.model_version = self.model.version_str  # the version this front resolved
        if request.device_outputs is not None or any(t.device is not None for t in request.inputs):
            # The relay carries host tensors only: a CUDA shared-memory input is read here, outputs
            # come back in host memory (and go into a CUDA region from here as host bytes).
            for t in request.inputs:
                if t.device is not None:
                    t.raw  # noqa: B018 - copies it to the host once (InferTensor.raw)
                    t.device = None
            request.device_outputs = None
        self.instance.submit([request])

    def pending_count(self) -> int:
        return 0  # queued in the supervisor, which counts it

    def close(self) -> None:
        pass


def relay_scheduler(front):
    """For the mirror: a relayed version's (instances, scheduler) over front.relay (set once the
    supervisor has given it)."""
    def make(model):
        instance = RelayedInstance(model, lambda: front.relay)
        return [instance], RelayScheduler(model, instance)

    return make
