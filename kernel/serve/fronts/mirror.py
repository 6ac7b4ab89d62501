"""A front's copy of the server's registry, kept as the supervisor publishes it.

The supervisor loads every model version once; a front gets each READY version as a Version
message (its config, where its files are, and a link to each of its worker instances) and makes
its own Model of it: the same validation, scheduler, statistics and cache as a single-process
server's, with instances that talk to the supervisor's workers over this front's links. A
version that must be served by one process (relayed) gets the front's relay instead. Entries
(state, reason, versions that failed) are copied as they are, so readiness and errors read the
same on every front. A version the supervisor retires is drained here first: the Reply to the
Publish comes once this front's requests to it have finished.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from typing import Any, Callable, Optional

from kernel.config import pbtxt as config_pbtxt
from kernel.core.backend import ModelSource
from kernel.core.model import Model, ModelState
from kernel.core.scheduling import make_scheduler
from kernel.protos.model_config_pb2 import ModelConfig
from kernel.serve.fronts import messages as m

log = logging.getLogger("kernel.fronts")


class Mirror:
    def __init__(self, server, link_id: int, attach_instances: Callable, relay_scheduler: Callable):
        """attach_instances(backend, source, link_id, links: list[(InstanceLink, channel_sock, fd_sock)]) ->
        instances (started); relay_scheduler(model) -> a relayed version's (instances, scheduler)."""
        self.server = server
        self.link_id = link_id
        self._attach_instances = attach_instances
        self._relay_scheduler = relay_scheduler
        self.by_uid: dict[int, Model] = {}
        self.published: set[str] = set()  # the entry names of the last Publish
        self._lock = asyncio.Lock()

    async def apply(self, msg: m.Publish, fds: list[int]) -> None:
        socks = [socket.socket(fileno=fd) for fd in fds]
        taken: set[int] = set()  # indices of the sockets an instance owns from now on
        async with self._lock:  # publishes apply in the order they were sent
            try:
                built = await asyncio.gather(*(self._build(v, socks, taken) for v in msg.attach),
                                             return_exceptions=True)
            finally:
                for i, s in enumerate(socks):
                    if i not in taken:
                        s.close()
            for v, model in zip(msg.attach, built):
                if isinstance(model, BaseException):
                    log.error("front %d could not attach '%s' version %d: %s", self.link_id, v.name, v.version, model)
                    continue
                self.by_uid[v.uid] = model
                self.server.registry.entry(v.name).versions[v.version] = model
            self._take_entries(msg.entries)
            retiring = [self.by_uid.pop(uid) for uid in msg.retire if uid in self.by_uid]
        if retiring:
            await self._retire(retiring)

    def relink(self, msg: m.Relink, fds: list[int]) -> Optional[Any]:
        """The worker behind one instance of a version restarted: the instance's new link."""
        model = self.by_uid.get(msg.uid)
        if model is None:
            for fd in fds:
                socket.socket(fileno=fd).close()
            return None
        for inst in model.instances:
            if inst.name == msg.instance.name and getattr(inst, "device_id", 0) == msg.instance.device_id:
                return inst, socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1])
        for fd in fds:
            socket.socket(fileno=fd).close()
        return None

    # ---- building a version -----------------------------------------------------------------

    async def _build(self, v: m.Version, socks: list[socket.socket], taken: set[int]) -> Model:
        config = ModelConfig.FromString(v.config)
        source = ModelSource(
            name=v.name, version=v.version, model_dir=Path(v.model_dir), version_dir=Path(v.version_dir),
            repository=Path(v.repository), config=config, config_json=v.config_json,
            backend_config=dict(v.backend_config),
        )
        model = Model(source, config_pbtxt.config_to_dict(config), platform=v.platform)
        server = self.server
        if v.relayed:
            model.instances, model.scheduler = self._relay_scheduler(model)
        else:
            if v.instances:
                backend = server.backends["python"]  # (worker links are the Python backend's, whatever the runtime)
                links = []
                for link in v.instances:
                    links.append((link, socks[link.fd], socks[link.fd + 1]))
                    taken.update((link.fd, link.fd + 1))  # the instance's from here on
                model.instances = await self._attach_instances(backend, source, self.link_id, links)
            model.stats.observer = server.metrics_config.observer_for(model)
            for inst in model.instances:
                inst.stats = model.stats
            model.scheduler = make_scheduler(server, model)
            if config.response_cache.enable:
                model.response_cache = server.response_cache
        model.stats.load_duration_s = v.load_duration_s
        model.state = ModelState.READY
        return model

    # ---- entries and retirement ---------------------------------------------------------------

    def _take_entries(self, entries: list[m.Entry]) -> None:
        registry = self.server.registry
        self.published = {e.name for e in entries}
        for e in entries:
            entry = registry.entry(e.name)
            entry.state = ModelState(e.state)
            entry.reason = e.reason
            entry.unavailable = dict(e.unavailable)
            for version, model in entry.versions.items():
                state = e.states.get(version)
                if state is not None and state != ModelState.LOADING.value:
                    model.state = ModelState(state)
        for name in [n for n in registry.entries if n not in self.published]:
            entry = registry.entries[name]
            for model in entry.versions.values():
                model.state = ModelState.UNLOADING  # refused from now on; drained when the supervisor retires it
            if not entry.versions:
                del registry.entries[name]

    async def _retire(self, models: list[Model]) -> None:
        """Drain this front's requests to these versions (within the exit timeout), then let go of them."""
        await self.server.retire_models(models)
        registry = self.server.registry
        for model in models:
            entry = registry.entries.get(model.name)
            if entry is not None and entry.versions.get(model.version) is model:
                del entry.versions[model.version]
            if entry is not None and not entry.versions and model.name not in self.published:
                del registry.entries[model.name]
