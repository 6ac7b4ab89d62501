"""The supervisor's side of the control channels: what the fronts ask, and what they are told.

- The registry: after anything that loads, unloads or reloads a model, every front is sent the
  registry as it is (Publish): versions it does not have yet, with a link to each of their
  worker instances (or marked relayed), the entries' states, and the versions to let go of. The
  caller waits for every front's Reply, so a load answered through one front is served by all.
- Model control calls, shared-memory registrations, trace and log settings from a front are done
  here and then on every front (and kept, to replay to a front that starts later).
- Statistics and metrics are totals: the supervisor's own numbers (its BLS and relayed calls)
  plus every front's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Optional

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.model import Model, ModelState
from kernel.core.stats import merge_statistics
from kernel.observe import log as server_log
from kernel.serve.fronts import messages as m
from kernel.serve.fronts.channel import socket_pairs
from kernel.serve.fronts.peers import trace_update
from kernel.serve.fronts.relay import RelayHost

if TYPE_CHECKING:
    from kernel.serve.fronts.supervisor import FrontHandle

log = logging.getLogger("kernel.fronts")

class Hub:
    def __init__(self, server):
        self.server = server
        self.fronts: dict[int, "FrontHandle"] = {}
        self.loaded = False  # start-up loading is over (fronts start every transport)
        self._uids: dict[int, tuple[int, Model]] = {}  # id(model) -> (uid, model)
        self._next_uid = itertools.count(1)
        self._publishing = asyncio.Lock()
        self._regions: dict[str, m.Regions] = {}  # registered client regions, by name, to replay
        self._traces: list[m.TraceChange] = []  # every trace-setting change, in order, to replay
        self.relays: dict[int, RelayHost] = {}  # each front's relay (relay.py), by front index
        server.before_retire = self.retire
        server.control.after_change = self.publish

    def live(self) -> list["FrontHandle"]:
        return [f for f in self.fronts.values() if f.hello and not f.channel.closed]

    # ---- the registry ---------------------------------------------------------------------------

    def uid(self, model: Model) -> int:
        known = self._uids.get(id(model))
        if known is None or known[1] is not model:
            known = self._uids[id(model)] = (next(self._next_uid), model)
        return known[0]

    async def publish(self, retire: tuple = (), fronts: Optional[list] = None) -> list[BaseException]:
        """Send every front (or `fronts`) the registry as it is now and wait until each has it
        (for versions in `retire`: until each has drained them); the fronts' failures.

        What a Publish says is decided and sent in order (one at a time, so a front applies them
        in the order they were decided); the waits for the Replies overlap: a front draining one
        model for the exit timeout does not hold up the next load."""
        retire_uids = {self.uid(model) for model in retire}
        async with self._publishing:
            targets = self.live() if fronts is None else fronts
            sent = []
            for front in targets:
                try:
                    sent.append(self._publish_to(front, retire_uids))
                except (ConnectionError, OSError) as exc:
                    failed = asyncio.get_running_loop().create_future()
                    failed.set_exception(exc)
                    sent.append(failed)
        results = await asyncio.gather(*sent, return_exceptions=True)
        failures = []
        for front, result in zip(targets, results):
            if isinstance(result, BaseException) and not isinstance(result, ConnectionError):
                failures.append(result)
                if not self.loaded or not isinstance(result, KernelError):
                    log.error("front %d did not take the model registry: %s", front.index, result)
        for key in [k for k, (uid, model) in self._uids.items() if model.state is ModelState.UNAVAILABLE
                    and not any(uid in f.attached for f in self.fronts.values())]:
            del self._uids[key]
        return failures

    def _publish_to(self, front: "FrontHandle", retire_uids: set) -> asyncio.Future:
        """Send `front` the registry now; the future of its Reply."""
        wanted: dict[int, Model] = {}
        entries = []
        for name, entry in sorted(self.server.registry.entries.items()):
            states = {}
            for version, model in entry.versions.items():
                states[version] = model.state.value
                if model.state in (ModelState.READY, ModelState.UNLOADING):
                    wanted[self.uid(model)] = model
            entries.append(m.Entry(name, entry.state.value, entry.reason, dict(entry.unavailable), states))
        attach, socks = [], []
        try:
            for uid, model in wanted.items():
                if uid in front.attached or model.state is not ModelState.READY:
                    continue
                version = self._version(model, uid, front.index, socks)
                if version is not None:
                    attach.append(version)
            retire = [uid for uid in front.attached if uid not in wanted or uid in retire_uids]
            message = m.Publish(0, entries, attach, retire, self.loaded, len(socks))
            reply = front.channel.request(message, [s.fileno() for s in socks])
        finally:
            for s in socks:
                s.close()  # sent: the front has its own copies
        front.attached.update(v.uid for v in attach)
        front.attached.difference_update(retire)
        return reply

    def _version(self, model: Model, uid: int, link_id: int, socks: list) -> Optional[m.Version]:
        src = model.source
        relayed = self.relayed(model)
        links = []
        if not relayed and not model.is_ensemble:
            opened = []
            try:
                for inst in model.instances:
                    chan, fd_sock = inst.open_link(link_id)
                    opened += [chan, fd_sock]
                    links.append(m.InstanceLink(inst.name, inst.kind, inst.device_id, len(socks) + len(opened) - 2,
                                                inst.facts()))
            except Exception as exc:  # noqa: BLE001 - a worker restarting: attached once it is back
                for s in opened:
                    s.close()
                log.info("'%s' version %d not attached to front %d yet: %s", model.name, model.version, link_id, exc)
                return None
            socks.extend(opened)
        return m.Version(
            uid, src.name, src.version, src.config.SerializeToString(), src.config_json, str(src.model_dir),
            str(src.version_dir), str(src.repository), model.platform, dict(src.backend_config), links, relayed,
            model.stats.load_duration_s,
        )

    @staticmethod
    def relayed(model: Model) -> bool:
        """Served through the supervisor: state that needs one owner, or instances that are not
        worker processes (callables, remote models). One owner: a sequence's slot and the order of
        its requests; a queue policy (a bound on the queue, timeouts, priority levels), which is a
        property of one queue. A dynamic batcher without one is run by every front, the worker
        merging the batches that wait for it."""
        if model.is_ensemble:
            return False
        choice = model.config.WhichOneof("scheduling_choice")
        if choice == "sequence_batching":
            return True
        if choice == "dynamic_batching" and has_queue_policy(model.config.dynamic_batching):
            return True
        return not model.instances or not all(hasattr(inst, "open_link") for inst in model.instances)

    async def retire(self, models: list[Model]) -> None:
        """Server.before_retire: every front drains these versions before their instances stop."""
        await self.publish(retire=tuple(models))

    async def relink(self, instance) -> None:
        """A worker restarted: the fronts that serve its version get a new link to it."""
        for entry in self.server.registry.entries.values():
            for model in entry.versions.values():
                if instance in model.instances:
                    uid = self.uid(model)
                    await asyncio.gather(*(self._relink(f, uid, instance) for f in self.live() if uid in f.attached),
                                         return_exceptions=True)
                    return

    async def _relink(self, front: "FrontHandle", uid: int, instance) -> None:
        chan, fd_sock = instance.open_link(front.index)
        try:
            link = m.InstanceLink(instance.name, instance.kind, instance.device_id, 0, instance.facts())
            await front.channel.call(m.Relink(0, uid, link), [chan.fileno(), fd_sock.fileno()])
        finally:
            chan.close()
            fd_sock.close()

    # ---- a front starts: everything it must know --------------------------------------------------

    async def welcome(self, front: "FrontHandle") -> None:
        """Its relay, settings, regions and the registry, for a front that just said Hello."""
        old = self.relays.pop(front.index, None)
        if old is not None:
            old.close()
        (chan_ours, chan_theirs), (fd_ours, fd_theirs) = socket_pairs()
        relay = self.relays[front.index] = RelayHost(self.server, front.index, chan_ours, fd_ours)
        await relay.open()
        try:
            await front.channel.call(m.RelayLink(0), [chan_theirs.fileno(), fd_theirs.fileno()])
        finally:
            chan_theirs.close()
            fd_theirs.close()
        s = self.server.log_settings
        await front.channel.call(m.LogChange(0, {"info": s.info, "warning": s.warning, "error": s.error,
                                                 "verbose": s.verbose, "format": s.format}))
        for change in self._traces:
            await front.channel.call(m.TraceChange(0, change.model_name, change.level, change.rate, change.count,
                                                   change.log_frequency))
        for regions in list(self._regions.values()):
            await front.channel.call(m.Regions(0, regions.change))
        front.hello = True
        await self.publish(fronts=[front])

    # ---- what fronts ask ----------------------------------------------------------------------------

    async def handle(self, front: "FrontHandle", msg, fds):
        kind = type(msg)
        if kind is m.Control:
            return await self._control(msg)
        if kind is m.Statistics:
            return await self.statistics(msg.name, msg.version)
        if kind is m.MetricsText:
            return await self.metrics_text()
        if kind is m.TraceRecords:
            self.server.tracer.save_records(msg.path, msg.records, msg.indexed)
            return None
        if kind is m.Regions:
            return await self._regions_change(msg)
        if kind is m.LogChange:
            server_log.update_settings(self.server, **msg.changes)  # here: every worker takes them
            await self._everywhere(m.LogChange(0, msg.changes))
            return None
        if kind is m.TraceChange:
            self.server.tracer.update(msg.model_name, trace_update(msg))
            self._traces.append(msg)
            await self._everywhere(m.TraceChange(0, msg.model_name, msg.level, msg.rate, msg.count, msg.log_frequency))
            return None
        raise KernelError(ErrorCode.INTERNAL, f"unexpected message {kind.__name__} from front {front.index}")

    async def _control(self, msg: m.Control):
        """A model control call, run here; the control publishes what changed before it returns
        (ModelControl.after_change is this hub's publish)."""
        control = self.server.control
        op = msg.op
        if op == "index":
            return await control.index(msg.ready_only)
        if op == "is_ready":
            return await control.is_ready(msg.name, msg.version)
        if op == "load":
            await control.load(msg.name, msg.config, msg.files)
        elif op == "unload":
            await control.unload(msg.name, msg.unload_dependents)
        elif op == "load_from_path":
            await control.load_from_path(msg.name, msg.path)
        elif op == "unload_from_path":
            await control.unload_from_path(msg.name)
        else:
            raise KernelError(ErrorCode.INVALID_ARG, f"unknown model control call '{op}'")
        return None

    async def _regions_change(self, msg: m.Regions) -> None:
        change = msg.change
        change.apply(self.server.shared_memory)  # checked here first: the client gets this error
        if change.op.startswith("register"):
            self._regions[change.name] = m.Regions(0, change)
        elif change.name:
            self._regions.pop(change.name, None)
        else:
            cuda = change.op == "unregister_cuda"
            for name in [n for n, r in self._regions.items() if (r.change.op == "register_cuda") == cuda]:
                del self._regions[name]
        failures = await self._everywhere(m.Regions(0, change))
        if failures and change.op.startswith("register"):
            undo = type(change)("unregister_cuda" if change.op == "register_cuda" else "unregister_system", change.name)
            undo.apply(self.server.shared_memory)
            self._regions.pop(change.name, None)
            await self._everywhere(m.Regions(0, undo))
            raise failures[0]

    async def _everywhere(self, message) -> list[BaseException]:
        """Send a change to every front and wait for them; the failures (a front's KernelError)."""
        fronts = self.live()
        results = await asyncio.gather(*(f.channel.call(type(message)(**_fields(message))) for f in fronts),
                                       return_exceptions=True)
        return [r for r in results if isinstance(r, KernelError)]

    async def statistics(self, name: str, version: str) -> dict:
        local = self.server.statistics(name, version)  # unknown models: Triton's error, from here
        parts = await asyncio.gather(*(f.channel.call(m.Collect(0, "statistics", name, version))
                                       for f in self.live()), return_exceptions=True)
        return merge_statistics([local, *(p for p in parts if isinstance(p, dict))])

    async def front_metrics(self) -> list:
        parts = await asyncio.gather(*(f.channel.call(m.Collect(0, "metrics")) for f in self.live()),
                                     return_exceptions=True)
        return [p for p in parts if isinstance(p, list)]

    async def metrics_text(self) -> str:
        from kernel.observe.metrics import MetricsService

        service = getattr(self, "_metrics", None)
        if service is None:
            service = self._metrics = MetricsService(self.server, self.server.metrics_config, cpu_metrics=False,
                                                     gpu_metrics=False)
            service.others = self.front_metrics
        return await service.total_text()

    async def all_ready(self, ready: bool) -> None:
        await asyncio.gather(*(f.channel.call(m.AllReady(0, ready)) for f in self.live()), return_exceptions=True)


def _fields(message) -> dict:
    return {f: getattr(message, f) for f in message.__struct_fields__}


def has_queue_policy(db) -> bool:
    """A dynamic batcher whose queue has rules of its own: priority levels, a size bound, timeouts."""
    policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
    return bool(db.priority_levels) or any(
        p.max_queue_size or p.default_timeout_microseconds or p.allow_timeout_override for p in policies)
