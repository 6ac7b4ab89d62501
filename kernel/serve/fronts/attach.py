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

from kernel.backends.python.instance import WorkerFacts
from kernel.core.backend import ModelSource
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


class RelayScheduler:
    """The scheduler of a relayed version in a front: hands each request to the supervisor at once."""

    def __init__(self, model, relay):
        self.model = model
        self.relay = relay  # the front's relay instance (None until the supervisor gave it)

    def enqueue(self, request: InferRequest) -> None:
        relay = self.relay()
        if relay is None or not relay.healthy:
            raise KernelError(ErrorCode.UNAVAILABLE, f"model '{self.model.name}' cannot be reached: the server "
                                                     "is starting or stopping")
        request.model_version = self.model.version_str  # the version this front resolved
        relay.submit([request])

    def pending_count(self) -> int:
        return 0  # queued in the supervisor, which counts it

    def close(self) -> None:
        pass


def relay_scheduler(front):
    """The factory the mirror uses for relayed versions (front.relay is set once the supervisor gives it)."""
    return lambda model: RelayScheduler(model, lambda: front.relay)
