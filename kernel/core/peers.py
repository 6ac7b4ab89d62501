"""The rest of the server, as one front process's core sees it (`Server.peers`).

A server may run several front processes in front of one set of model instances
(`kernel serve --front-processes N`, kernel.serve.fronts). To a client it is still one server:
whatever a client can change or count (shared-memory regions, trace and log settings, model
control, statistics) must act on, or be totalled over, every front. The core of a front asks this
handle for those; `Server.peers` is None in a single-process server, and the core then does them
itself. The core imports nothing that implements it (kernel.serve.fronts does).
"""

from __future__ import annotations

from typing import Any, Protocol


class Peers(Protocol):
    @property
    def ready(self) -> bool:
        """Every front of the server is ready (a front's own readiness also needs its models)."""
        ...

    async def change_shared_memory(self, change: Any) -> None:
        """Apply a kernel.core.shared_memory.RegionChange on every front; KernelError as registering
        it here would raise. Returns once every front has it: the client may use it on any connection."""
        ...

    async def statistics(self, name: str, version: str) -> dict:
        """The statistics extension's answer totalled over every process of the server."""
        ...

    async def change_log_settings(self, changes: dict) -> None:
        """Apply logging-extension changes (kernel.observe.log.LogSettings fields) everywhere."""
        ...

    async def change_trace_settings(self, model_name: str, change: Any) -> None:
        """Apply a trace-setting change (kernel.observe.trace_settings.TraceUpdate) everywhere."""
        ...

    async def metrics_text(self) -> str:
        """The Prometheus text of the whole server (what the metrics port serves)."""
        ...
