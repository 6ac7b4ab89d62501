"""A front's view of the rest of the server: kernel.core.peers.Peers and the model control handle,
both answered by the supervisor over the control channel.

Model control (the repository API, SageMaker's multi-model endpoint, PyTriton's bind) runs in the
supervisor, which owns the workers; it publishes the result to every front before it answers, so
a client that loads a model through one connection can use it through any other at once.
"""

from __future__ import annotations

from typing import Any, Optional

from kernel.core.errors import ErrorCode, KernelError
from kernel.loading.names import validate_model_name
from kernel.observe.trace_settings import CLEAR, SETTING_FIELDS, TraceLevel, TraceUpdate
from kernel.serve.fronts import messages as m
from kernel.serve.fronts.channel import ControlChannel


def trace_change(model_name: str, update: TraceUpdate) -> m.TraceChange:
    """A TraceUpdate as a message (CLEAR as the string "CLEAR", a level as its int)."""
    values = {}
    for field in SETTING_FIELDS:
        value = getattr(update, field)
        values[field] = "CLEAR" if value is CLEAR else int(value) if value is not None else None
    return m.TraceChange(0, model_name, **values)


def trace_update(msg: m.TraceChange) -> TraceUpdate:
    update = TraceUpdate()
    for field in SETTING_FIELDS:
        value = getattr(msg, field)
        if value == "CLEAR":
            value = CLEAR
        elif value is not None and field == "level":
            value = TraceLevel(value)
        setattr(update, field, value)
    return update


class FrontPeers:
    """kernel.core.peers.Peers for a front: every change goes through the supervisor, which
    applies it on every front (this one included) before it answers."""

    def __init__(self, channel: ControlChannel):
        self.channel = channel
        self.all_ready = False  # the supervisor's AllReady

    @property
    def ready(self) -> bool:
        return self.all_ready

    async def change_shared_memory(self, change) -> None:
        await self._call(m.Regions(0, change))

    async def statistics(self, name: str, version: str) -> dict:
        return await self._call(m.Statistics(0, name, version))

    async def change_log_settings(self, changes: dict) -> None:
        await self._call(m.LogChange(0, dict(changes)))

    async def change_trace_settings(self, model_name: str, change: TraceUpdate) -> None:
        await self._call(trace_change(model_name, change))

    async def metrics_text(self) -> str:
        return await self._call(m.MetricsText(0))

    async def _call(self, message) -> Any:
        try:
            return await self.channel.call(message)
        except ConnectionError:
            raise KernelError(ErrorCode.UNAVAILABLE, "Server is stopping; the request was not handled") from None


class ForwardedControl:
    """kernel.core.backend.ModelControlHandle (and the repository index) in a front."""

    def __init__(self, channel: ControlChannel):
        self.channel = channel

    async def _control(self, op: str, **fields) -> Any:
        try:
            return await self.channel.call(m.Control(0, op, **fields))
        except ConnectionError:
            raise KernelError(ErrorCode.UNAVAILABLE, "Server is stopping; models cannot be loaded") from None

    # start-up, polling and shutdown are the supervisor's
    async def load_startup_models(self) -> bool:
        return True

    def start_polling(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def index(self, ready_only: bool = False) -> list[dict]:
        return await self._control("index", ready_only=ready_only)

    async def load(self, name: str, config: Optional[str] = None, files: Optional[dict[str, bytes]] = None) -> None:
        await self._control("load", name=name, config=config, files=files)

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        await self._control("unload", name=name, unload_dependents=unload_dependents)

    async def load_from_path(self, name: str, path) -> None:
        await self._control("load_from_path", name=name, path=str(path))

    async def unload_from_path(self, name: str) -> None:
        await self._control("unload_from_path", name=name)

    async def is_ready(self, name: str, version: str = "") -> bool:
        return await self._control("is_ready", name=name, version=version)

    def validate_name(self, name: str) -> None:
        validate_model_name(name)
