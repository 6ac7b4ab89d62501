"""The backend behind Triton.bind(): model versions whose instances are Python callables.

It is registered under the name "python", so bound models carry `backend:
"python"` in their config exactly as PyTriton's do. Models it has no callable
for (a model.py model in the same repository) go to the real Python backend
it wraps, when it has one.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from kernel.core.backend import Backend, BackendInstance, ModelSource
from kernel.core.errors import ErrorCode, KernelError
from kernel.backends.callable.inbox import LoopInbox
from kernel.backends.callable.instance import CallableInstance
from kernel.backends.callable.outputs import OutputError, ResultConverter, output_spec
from kernel.backends.callable.runner import AsyncRunner


@dataclass
class BoundModel:
    """A model version served by callables: one callable per instance (or one for all)."""

    name: str
    version: int
    callables: Sequence[Callable]
    outputs: Sequence[Any]  # TensorSpec-like: name, shape, dtype
    batching: bool
    decoupled: bool = False
    strict: bool = False
    #: called on the front loop when a callable raises PyTritonUnrecoverableError
    on_unrecoverable: Optional[Callable[[BaseException], None]] = None
    instances: list = field(default_factory=list)


class CallableBackend(Backend):
    name = "python"

    def __init__(self, fallback: Optional[Backend] = None):
        self.fallback = fallback
        self._bound: dict[tuple[str, int], BoundModel] = {}
        self._lock = threading.Lock()  # bind() runs on the user's thread
        self._inboxes: dict[int, LoopInbox] = {}
        self.runner = AsyncRunner()

    def attach(self, core) -> None:
        super().attach(core)
        if self.fallback is not None:
            self.fallback.attach(core)

    # ---- bound models ------------------------------------------------------------------------

    def register(self, model: BoundModel) -> None:
        with self._lock:
            self._bound[(model.name, model.version)] = model

    def unregister(self, name: str, version: int) -> None:
        with self._lock:
            self._bound.pop((name, version), None)

    def bound(self, name: str, version: int) -> Optional[BoundModel]:
        with self._lock:
            return self._bound.get((name, version))

    def _is_bound(self, config: Any) -> bool:
        with self._lock:
            return any(name == config.name for name, _ in self._bound)

    # ---- Backend -----------------------------------------------------------------------------

    async def auto_complete(self, source: ModelSource) -> Optional[dict]:
        if self.bound(source.name, source.version) is None and self.fallback is not None:
            return await self.fallback.auto_complete(source)
        return None

    def model_file(self, version_dir: Path, config: Any) -> Optional[Path]:
        if self._is_bound(config) or self.fallback is None:
            return None
        return self.fallback.model_file(version_dir, config)

    def discover(self, name: str, backend_directory: Path):
        if self.fallback is not None:
            return self.fallback.discover(name, backend_directory)
        return None, []

    def complete_config(self, config: Any) -> None:
        if self.fallback is not None and not self._is_bound(config):
            self.fallback.complete_config(config)

    async def load(self, source: ModelSource) -> list[BackendInstance]:
        model = self.bound(source.name, source.version)
        if model is None:
            if self.fallback is not None:
                return await self.fallback.load(source)
            raise KernelError(ErrorCode.INVALID_ARG, f"no inference callable is bound to model '{source.name}' "
                              f"version {source.version}")
        names = [f"{group.name}_{i}" for group in source.config.instance_group for i in range(group.count or 1)]
        callables = list(model.callables)
        if len(callables) == 1:
            callables = callables * len(names)
        if len(callables) != len(names):
            raise KernelError(
                ErrorCode.INVALID_ARG,
                f"model '{source.name}' has {len(names)} instances but {len(callables)} inference callables",
            )
        try:
            specs = [output_spec(o.name, o.dtype, o.shape) for o in model.outputs]
        except OutputError as exc:
            raise KernelError(ErrorCode.INVALID_ARG, str(exc)) from None
        converter = ResultConverter(source.name, str(source.version), specs, model.batching, model.strict)
        inbox = self._inbox_for(asyncio.get_running_loop())
        max_batch_size = source.config.max_batch_size
        instances = [
            CallableInstance(name, fn, converter, [s.name for s in specs], max_batch_size, model.decoupled,
                             inbox, self.runner, model.on_unrecoverable)
            for name, fn in zip(names, callables)
        ]
        for inst in instances:
            await inst.start()
        model.instances = instances
        return instances

    def _inbox_for(self, loop: asyncio.AbstractEventLoop) -> LoopInbox:
        inbox = self._inboxes.get(id(loop))
        if inbox is None:
            inbox = self._inboxes[id(loop)] = LoopInbox(loop)
        return inbox

    def close(self) -> None:
        """Stop the async callables' loop (the server has stopped)."""
        self.runner.stop()
