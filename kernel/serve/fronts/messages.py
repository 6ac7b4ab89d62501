"""The control channel's messages between the supervisor and a front (msgspec, msgpack-framed).

A message with a non-zero `key` asks for a Reply with that key; key 0 expects none. A message
that carries file descriptors says how many in `fds`: they travel on the channel's fd socket
just before it (channel.py).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import msgspec

from kernel.backends.python.instance import WorkerFacts
from kernel.core.shared_memory import RegionChange


class Fault(msgspec.Struct, array_like=True):
    code: str  # kernel.core.errors.ErrorCode name
    message: str


class Reply(msgspec.Struct, tag="reply", array_like=True, omit_defaults=True):
    key: int
    value: Any = None
    fault: Optional[Fault] = None


# ---- front -> supervisor ---------------------------------------------------------------------


class Hello(msgspec.Struct, tag="hello", array_like=True):
    """A front started and listens on every port that serves while models load."""

    key: int
    index: int
    pid: int


class Control(msgspec.Struct, tag="control", array_like=True, omit_defaults=True):
    """A model control call (kernel.core.backend.ModelControlHandle and the repository index)."""

    key: int
    op: str  # index | load | unload | load_from_path | unload_from_path | is_ready
    name: str = ""
    config: Optional[str] = None
    files: Optional[dict[str, bytes]] = None
    unload_dependents: bool = False
    ready_only: bool = False
    path: str = ""
    version: str = ""


class Statistics(msgspec.Struct, tag="statistics", array_like=True):
    key: int
    name: str = ""
    version: str = ""


class MetricsText(msgspec.Struct, tag="metrics_text", array_like=True):
    key: int


class TraceRecords(msgspec.Struct, tag="trace_records", array_like=True):
    """Finished traces (Triton's JSON records) for the trace file the supervisor writes."""

    key: int
    path: str
    records: str
    indexed: bool


# ---- both directions -------------------------------------------------------------------------


class Regions(msgspec.Struct, tag="regions", array_like=True):
    """A client shared-memory registration: front -> supervisor (do it everywhere), then
    supervisor -> every front (do it here)."""

    key: int
    change: RegionChange


class LogChange(msgspec.Struct, tag="log_change", array_like=True):
    key: int
    changes: dict[str, Any]


class TraceChange(msgspec.Struct, tag="trace_change", array_like=True):
    """A trace-setting change; each setting None (leave), "CLEAR", or its value (level as TraceLevel's int)."""

    key: int
    model_name: str
    level: Any = None
    rate: Any = None
    count: Any = None
    log_frequency: Any = None


# ---- supervisor -> front ---------------------------------------------------------------------


class InstanceLink(msgspec.Struct, array_like=True, omit_defaults=True):
    """One model instance a front reaches over its own link: the link's two sockets are the
    message's fds at `fd` and `fd + 1`."""

    name: str
    kind: str
    device_id: int
    fd: int
    facts: Optional[WorkerFacts] = None  # what the front must know of the worker


class Version(msgspec.Struct, array_like=True, omit_defaults=True):
    """A model version a front serves, as the supervisor loaded it."""

    uid: int  # the supervisor's id of this Model object (a reload of the same version is another)
    name: str
    version: int
    config: bytes  # ModelConfig, serialized
    config_json: str  # what initialize(args)["model_config"] received
    model_dir: str
    version_dir: str
    repository: str
    platform: str
    backend_config: dict[str, str] = {}
    instances: list[InstanceLink] = []
    relayed: bool = False  # served through the supervisor (relay.py): no instances here
    load_duration_s: float = 0.0


class Entry(msgspec.Struct, array_like=True, omit_defaults=True):
    """A registry entry's state as the supervisor has it (ModelEntry without its versions)."""

    name: str
    state: str
    reason: str = ""
    unavailable: dict[int, str] = {}
    states: dict[int, str] = {}  # version -> state of the versions the supervisor has


class Publish(msgspec.Struct, tag="publish", array_like=True, omit_defaults=True):
    """The registry as it is now: attach `attach`, take the states, then retire `retire` (uids):
    drain what this front sent them and let go of them. The Reply comes once that is done."""

    key: int
    entries: list[Entry]
    attach: list[Version] = []
    retire: list[int] = []
    loaded: bool = False  # start-up loading is over: start the transports that waited for it
    fds: int = 0


class Relink(msgspec.Struct, tag="relink", array_like=True):
    """A worker was restarted: the instance `name` of version `uid` has a new link (fds 0, 1)."""

    key: int
    uid: int
    instance: InstanceLink
    fds: int = 2


class RelayLink(msgspec.Struct, tag="relay_link", array_like=True):
    """This front's link to the supervisor's relay (relay.py): its two sockets are fds 0 and 1."""

    key: int
    fds: int = 2


class AllReady(msgspec.Struct, tag="all_ready", array_like=True):
    """Whether every front is ready (a front is ready only while the whole server is)."""

    key: int
    ready: bool


class Collect(msgspec.Struct, tag="collect", array_like=True):
    """This front's own numbers: statistics (what = "statistics", name, version) or its metric
    families (what = "metrics")."""

    key: int
    what: str
    name: str = ""
    version: str = ""


class Stop(msgspec.Struct, tag="stop", array_like=True):
    """Stop listening, drain within the exit timeout, exit."""

    key: int


ToSupervisor = Union[Reply, Hello, Control, Statistics, MetricsText, TraceRecords, Regions, LogChange, TraceChange]
ToFront = Union[Reply, Publish, Relink, RelayLink, AllReady, Collect, Stop, Regions, LogChange, TraceChange]
