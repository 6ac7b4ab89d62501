"""What the core asks of a backend. Backends live in backends/ and plug in here.

The core never imports a backend module: the server is handed Backend objects
by whoever composes it (the CLI), by name.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Optional, Protocol

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest


@dataclass
class ModelSource:
    """Where a model version comes from, and its (complete) configuration."""

    name: str
    version: int
    model_dir: Path  # <repository>/<model>
    version_dir: Path  # <repository>/<model>/<version>
    repository: Path
    config: Any  # kernel.protos.model_config_pb2.ModelConfig
    config_json: str  # what initialize(args)["model_config"] receives
    backend_config: dict[str, str] = field(default_factory=dict)


class BackendInstance(abc.ABC):
    """One model instance (e.g. a worker process) that executes batches of requests."""

    name: str
    healthy: bool

    #: Set by the model's scheduler: called with the instance whenever it may
    #: take more work (an execution finished, its pending work was failed, it
    #: (re)started). Backends call notify_available() at those points.
    on_available: Optional[Callable[["BackendInstance"], None]] = None
    #: Set by a dynamic batcher: called with the instance and a batch size when the instance is
    #: shared (below) and about to run a batch that has room for that many more. Another process's
    #: batch is waiting for what this process queued: the scheduler hands over what it has, at once,
    #: whatever its queue delay, so that requests that came through different processes batch as one
    #: queue would batch them (kernel.backends.python.worker_merge).
    on_gather: Optional[Callable[["BackendInstance", int], None]] = None
    #: Set by the core after load: the model version's kernel.core.stats.ModelStats.
    #: Backends report each finished execution into it (record_execution).
    stats: Any = None

    @property
    @abc.abstractmethod
    def in_flight(self) -> int:
        """Requests handed to this instance that have not had their final response."""

    #: True when other processes also feed this instance (several front processes in front of one
    #: worker: kernel.backends.python.link). Schedulers then pick the least loaded instance and
    #: never queue requests in this process: another process's finished execution never wakes
    #: this process's queue.
    shared: bool = False

    #: True when submit() takes an input whose `raw` is still a kernel.core.shared_memory.InputWindow
    #: (a client's system shared-memory region, not read yet) and reads it straight into its own
    #: memory, answering the request with the window's error if the client shrank the object.
    #: Otherwise the core reads such inputs before the request is scheduled (kernel.core.admission).
    takes_input_windows: bool = False

    @property
    def load(self) -> int:
        """The requests this instance holds server-wide, for every process that feeds it; the
        fallback (an instance only this process feeds) is its in-flight requests."""
        return self.in_flight

    @property
    def executing(self) -> int:
        """Batches handed to submit() whose execution has not finished yet.

        The batching schedulers dispatch to an instance only when this is 0.
        Backends that know when an execution ends (before the last response of
        a decoupled request) override it; the fallback is in-flight requests.
        """
        return self.in_flight

    def notify_available(self) -> None:
        callback = self.on_available
        if callback is not None:
            callback(self)

    async def check_ready(self) -> tuple[bool, str]:
        """(ready, reason). Backends whose models can report readiness override this."""
        return self.healthy, "" if self.healthy else f"instance '{self.name}' is not healthy"

    @abc.abstractmethod
    def submit(self, requests: list[InferRequest]) -> None:
        """Execute these requests; responses go to each request's on_response."""

    @abc.abstractmethod
    async def stop(self, timeout: float) -> None:
        """Let in-flight work finish (up to timeout), finalize the model, end the instance."""


# Load parameters named "file:<path>" carry the files of the model folder to load (the repository
# extension's load request): transports collect them for ModelControlHandle.load's `files`.
FILE_PREFIX = "file:"


class ModelControlHandle(Protocol):
    """Model control as the core, transports and backends see it (kernel.loading.control.ModelControl)."""

    async def load_startup_models(self) -> bool: ...

    def start_polling(self) -> None: ...

    async def stop(self) -> None: ...

    async def load(self, name: str, config: Optional[str] = None, files: Optional[dict[str, bytes]] = None) -> None: ...

    async def unload(self, name: str, unload_dependents: bool = False) -> None: ...

    async def is_ready(self, name: str, version: str = "") -> bool: ...

    def validate_name(self, name: str) -> None:
        """Raise KernelError (INVALID_ARG, Triton's words) for a name no model can have: a path, shell
        characters, control characters, too long. For names that become models outside load()."""
        ...


class CoreHandle(Protocol):
    """Everything a backend may ask of the core.

    Run a request (BLS) and look a model up; load and unload models (pb_utils.load_model and
    friends go through `control`); and the custom metric families models create
    (`custom_metrics`: kernel.observe.metrics.CustomMetrics, None when metrics are off).
    """

    control: Optional[ModelControlHandle]
    custom_metrics: Any
    # kernel.observe.trace.Tracer (None when not composed): a BLS call that passes its caller's
    # trace context (InferenceRequest(trace=request.trace())) is traced as the caller's child.
    tracer: Any

    def submit(self, request: InferRequest) -> None: ...

    def model(self, name: str, version: str = "") -> Any: ...


class Backend(abc.ABC):
    name: str
    core: Optional[CoreHandle] = None

    def attach(self, core: CoreHandle) -> None:
        """Called once by the server that owns this backend."""
        self.core = core

    @abc.abstractmethod
    async def auto_complete(self, source: ModelSource) -> Optional[dict]:
        """Run the model's own config auto-completion; return the completed config dict or None."""

    @abc.abstractmethod
    async def load(self, source: ModelSource) -> list[BackendInstance]:
        """Start every instance of a model version. Raises KernelError when the model cannot load.

        Cancelled (a signal during start-up abandons the loads), it stops what it had started."""

    def default_model_filename(self) -> str:
        return "model.py"

    def model_file(self, version_dir: Path, config: Any) -> Optional[Path]:
        """The file a model version must provide (checked before load); None: nothing to check.

        A config's default_model_filename is a name inside the version folder: an absolute
        path or one with '..' would run a file from anywhere on the machine.
        """
        name = config.default_model_filename or self.default_model_filename()
        parts = PurePosixPath(name).parts
        if not parts or parts[0] == "/" or ".." in parts or "\\" in name:
            raise KernelError(
                ErrorCode.INVALID_ARG,
                f"default_model_filename '{name}' must name a file inside the model's version folder "
                "(a relative path without '..')",
            )
        return version_dir / name

    def discover(self, name: str, backend_directory: Path) -> tuple[Optional["Backend"], list[str]]:
        """A backend called `name` found in the backend directory that this backend runs
        (e.g. a Python-based backend), and the paths looked at; (None, paths) when absent."""
        return None, []

    def complete_config(self, config: Any) -> None:
        """Fill in the config fields the core sets for models of this backend (e.g. runtime)."""

    def update_log_settings(self, settings: Any) -> None:
        """The server's log settings changed (kernel.observe.log.LogSettings): pass them to running instances."""
