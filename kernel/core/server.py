"""The server object: loads the model repository, serves requests, shuts down cleanly.

Transports call into it (`submit`, health, metadata, config); backends are
handed to it by name. It imports neither.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kernel import __version__

from kernel.config import pbtxt as config_pbtxt

from kernel.loading import repository

from kernel.observe import log as server_log
from kernel.core.backend import Backend, ModelSource
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.model import Model, ModelState
from kernel.loading.control import ModelControl
from kernel.core.registry import ModelRegistry
from kernel.core.request import InferRequest
from kernel.observe.metrics import CustomMetrics, MetricsConfig
from kernel.core.scheduling.direct import make_scheduler
from kernel.core.shared_memory import SharedMemoryManager, route_through_windows
from kernel.observe.log import LogSettings
from kernel.observe.trace import TraceConfig, Tracer, TraceUpdate
from kernel.core.transport import Transport

log = logging.getLogger("kernel.core.server")

# KServe v2 extensions this server speaks (reported by GET /v2), in tritonserver's order.
EXTENSIONS = [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
    "model_configuration", "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
    "statistics", "trace", "logging",
]


@dataclass
class ServerOptions:
    model_repositories: list[Path]
    server_id: str = "triton"
    exit_timeout_secs: float = 30.0
    strict_readiness: bool = True
    exit_on_error: bool = True
    disable_auto_complete_config: bool = False
    strict_model_config: bool = False
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    log_verbose: int = 0
    backend_directory: Optional[Path] = None  # where backends not built in are looked for
    metrics_config: dict[str, str] = field(default_factory=dict)  # --metrics-config (global group)
    # Model control (kernel/loading/control.py): --model-control-mode, --load-model,
    # --repository-poll-secs, --model-config-name.
    model_control_mode: str = "none"
    startup_models: list[str] = field(default_factory=list)
    repository_poll_secs: float = 15.0
    model_config_name: str = ""
    trace: TraceConfig = field(default_factory=TraceConfig)  # --trace-config
    log: Optional[LogSettings] = None  # --log-*; None: defaults with log_verbose


class StartupError(Exception):
    """Start-up failed in a way that must stop the server (e.g. a model failed with --exit-on-error)."""


class Server:
    def __init__(self, options: ServerOptions, backends: dict[str, Backend]):
        self.options = options
        self.backends = backends
        for backend in backends.values():
            backend.attach(self)
        self.registry = ModelRegistry()
        # Model control modes, the repository API and poll mode.
        self.control = ModelControl(self)
        self.transports: list[Transport] = []
        self.live = False
        self._shutting_down = False
        self._loaded = False
        # Ready only once every transport listens: a client that saw /v2/health/ready on HTTP
        # must find the gRPC port open too.
        self._listening = False
        # Statistics and metrics (kernel.core.stats, kernel.observe.metrics): custom metric
        # families that models create, and what --metrics-config turns on.
        self.custom_metrics = CustomMetrics()
        self.metrics_config = MetricsConfig(options.metrics_config)
        # Logging and trace extensions (GET/POST /v2/logging, /v2/trace/setting).
        self.log_settings = options.log or LogSettings(verbose=options.log_verbose)
        self.tracer = Tracer(options.trace)
        # Client shared-memory regions (system/CUDA shared-memory extensions), used by every transport.
        self.shared_memory = SharedMemoryManager()

    # ---- health and metadata ---------------------------------------------

    @property
    def ready(self) -> bool:
        if not self.live or not self._loaded or not self._listening or self._shutting_down:
            return False
        if not self.options.strict_readiness:
            return True
        for e in self.registry.entries.values():
            if e.unloaded:
                continue
            if e.state is ModelState.UNAVAILABLE:
                return False
            if not any(m.ready for m in e.versions.values()):
                return False
        return True

    def metadata(self) -> dict:
        return {"name": self.options.server_id, "version": __version__, "extensions": EXTENSIONS}

    def model(self, name: str, version: str = "") -> Model:
        return self.registry.get(name, version)

    async def model_ready(self, name: str, version: str = "") -> bool:
        """Loaded, with a live instance whose model (if it has is_ready) says it is ready."""
        try:
            model = self.registry.get(name, version)
        except KernelError:
            return False
        if not model.ready:
            return False
        if model.is_ensemble:
            return True
        results = await asyncio.gather(*(inst.check_ready() for inst in model.instances))
        return any(ok for ok, _ in results)

    def model_metadata(self, name: str, version: str = "") -> dict:
        model = self.registry.get(name, version)
        entry = self.registry.entries[name]
        versions = [str(v) for v, m in sorted(entry.versions.items()) if m.state is ModelState.READY]
        return model.metadata(versions)

    def model_config(self, name: str, version: str = "") -> dict:
        return self.registry.get(name, version).config_dict

    # ---- inference ---------------------------------------------------------

    def submit(self, request: InferRequest) -> None:
        """Validate and schedule a request; responses go to request.on_response.

        Raises KernelError when the request is refused up front (unknown model,
        bad inputs, shutting down).
        """
        if self._shutting_down:
            raise KernelError(ErrorCode.UNAVAILABLE, "Server is stopping; new requests are not accepted")
        model = self.registry.get(request.model_name, request.model_version)
        try:
            model.validate(request)
        except KernelError as exc:
            # Triton tags request-validation errors with the request id.
            exc.message = f"[request id: {request.id or '<id_unknown>'}] {exc.message}"
            exc.args = (exc.message,)
            raise
        request.arrival_ns = _now_ns()
        if request.trace is not None:
            request.trace.on_submit(request, model, request.arrival_ns)
        if model.stats.observer is not None and model.stats.observer.first_response is not None:
            model.stats.observer.watch_first_response(request)
        if request.shm is not None:
            route_through_windows(request)
        model.scheduler.enqueue(request)

    def in_flight(self) -> int:
        models = self.registry.all_models()
        queued = sum(m.scheduler.pending_count() for m in models if m.scheduler is not None)
        return queued + sum(inst.in_flight for m in models for inst in m.instances)

    # ---- statistics ------------------------------------------------------------

    def statistics(self, name: str = "", version: str = "") -> dict:
        """The statistics extension's `$stats_model_response` (also behind gRPC ModelStatistics).

        Every ready version of every model when `name` is empty, else the ready
        versions of `name` ('' = all of them). Raises KernelError(INVALID_ARG)
        with Triton's messages for unknown models and versions.
        """
        if not name:
            models = sorted((m for m in self.registry.all_models() if m.state is ModelState.READY),
                            key=lambda m: (m.name, m.version))
            return {"model_stats": [m.stats.to_json() for m in models]}
        entry = self.registry.entries.get(name)
        ready = sorted((m for m in entry.versions.values() if m.state is ModelState.READY),
                       key=lambda m: m.version) if entry is not None else []
        if not ready:
            raise KernelError(ErrorCode.INVALID_ARG, f"requested model '{name}' is not available")
        if version:
            try:
                wanted = int(version)
            except ValueError:
                raise KernelError(
                    ErrorCode.INVALID_ARG, f"failed to get model version from specified version string '{version}' (details: stol), "
                    "version should be an integral value > 0"
                ) from None
            ready = [m for m in ready if m.version == wanted]
            if not ready:
                raise KernelError(
                    ErrorCode.INVALID_ARG, f"requested model version is not available for model '{name}'"
                )
        return {"model_stats": [m.stats.to_json() for m in ready]}

    # ---- logging and trace extensions ---------------------------------------------

    def update_log_settings(self, **changes) -> LogSettings:
        """Change log settings (LogSettings field names) at run time, here and in every model instance."""
        if not changes:
            return self.log_settings
        settings = self.log_settings = dataclasses.replace(self.log_settings, **changes)
        server_log.apply(settings)
        for backend in list(self.backends.values()):
            backend.update_log_settings(settings)
        return settings

    def check_trace_model(self, model_name: str) -> None:
        if model_name:
            entry = self.registry.entries.get(model_name)
            if entry is None or entry.latest_ready() is None:
                raise KernelError(ErrorCode.INVALID_ARG, f"Request for unknown model : {model_name}")

    def trace_settings(self, model_name: str = "") -> dict:
        """The trace extension's settings for a model ('' = global); raises for unknown models."""
        self.check_trace_model(model_name)
        return self.tracer.describe(model_name)

    def update_trace_settings(self, model_name: str, update: TraceUpdate) -> dict:
        self.check_trace_model(model_name)
        self.tracer.update(model_name, update)
        return self.tracer.describe(model_name)

    # ---- loading -------------------------------------------------------------

    async def load_repository(self) -> None:
        """Load what the model control mode loads at start-up (every model, or --load-model ones)."""
        all_found = await self.control.load_startup_models()
        self._loaded = True
        log.info(self.model_table())
        failed = [e for e in self.registry.entries.values() if e.state is ModelState.UNAVAILABLE]
        if (failed or not all_found) and self.options.exit_on_error:
            raise StartupError("failed to load all models")

    async def load_model(self, md: repository.ModelDir, config=None) -> None:
        """Load every version of a model that is not loaded; `config` overrides its config file."""
        entry = self.registry.entry(md.name)
        entry.state = ModelState.LOADING
        try:
            cfg = await self._complete_config(md, config)
            versions = repository.select_versions(cfg, sorted(md.versions))
        except KernelError as exc:
            self._load_failed(entry, None, exc.message)
            return
        except Exception as exc:  # noqa: BLE001 - a broken model must never stop the others
            self._load_failed(entry, None, f"{type(exc).__name__}: {exc}")
            return
        results = await asyncio.gather(*(self._load_version(md, cfg, v) for v in versions))
        entry.state = ModelState.READY if any(results) else ModelState.UNAVAILABLE
        if entry.state is ModelState.READY:
            log.info("successfully loaded '%s'", md.name)

    async def _complete_config(self, md: repository.ModelDir, config=None):
        cfg = repository.load_model_config(md) if config is None else _copy_config(config)
        if cfg.name and md.name != md.path.name:
            # Loaded under another name (load_model_from_path): that name wins,
            # as with Triton's repository name mapping.
            cfg.name = md.name
        if cfg.platform == config_pbtxt.ENSEMBLE_PLATFORM:  # run by the core, no backend
            config_pbtxt.normalize_config(cfg, md.name, model_path=md.path)
            config_pbtxt.validate_config(cfg)
            return cfg
        backend = self._backend_for(cfg, md)
        config_pbtxt.normalize_config(cfg, md.name, model_path=md.path)
        if not self.options.disable_auto_complete_config and not (
            self.options.strict_model_config and md.config_path is not None
        ):
            latest = max(md.versions) if md.versions else None
            if latest is not None and _defines_auto_complete(backend.model_file(md.versions[latest], cfg)):
                completed = await backend.auto_complete(self._source(md, cfg, latest))
                if completed is not None:
                    config_pbtxt.apply_autocomplete(cfg, config_pbtxt.config_from_dict(completed))
                    config_pbtxt.normalize_config(cfg, md.name, model_path=md.path)
        config_pbtxt.validate_config(cfg)
        return cfg

    def _backend_for(self, cfg, md: repository.ModelDir) -> Backend:
        name = cfg.backend or ("python" if not cfg.platform else cfg.platform)
        backend = self.backends.get(name) or self._discover_backend(name, md)
        if not cfg.backend:
            cfg.backend = name
        backend.complete_config(cfg)
        return backend

    def _discover_backend(self, name: str, md: repository.ModelDir) -> Backend:
        """A backend that is not built in: ask the built-in ones to find it in the backend directory."""
        searched: list[str] = []
        directory = self.options.backend_directory
        if directory is not None and name and "/" not in name and "\\" not in name and name not in (".", ".."):
            for candidate in list(self.backends.values()):
                found, paths = candidate.discover(name, Path(directory))
                searched += paths
                if found is not None:
                    found.attach(self)
                    self.backends[name] = found
                    return found
        where = f"; searched: {', '.join(repr(p) for p in searched)}" if searched else ""
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"unable to find backend '{name}' for model '{md.name}'{where} (Kernel serves Python-based backends "
            f"from --backend-directory; it does not load C++ backend libraries such as libtriton_{name}.so); "
            "available backends: " + ", ".join(sorted(self.backends)),
        )

    def _source(self, md: repository.ModelDir, cfg, version: int) -> ModelSource:
        backend = self.backends.get(cfg.backend)
        return ModelSource(
            name=md.name,
            version=version,
            model_dir=md.path,
            version_dir=md.versions[version],
            repository=md.path.parent,
            config=cfg,
            config_json=config_pbtxt.config_to_json(cfg),
            backend_config=self.options.backend_config.get(backend.name, {}) if backend is not None else {},
        )

    async def _load_version(self, md: repository.ModelDir, cfg, version: int) -> bool:
        entry = self.registry.entry(md.name)
        model = self._new_model(md, cfg, version)
        entry.versions[version] = model
        try:
            await self._start_model(model, md)
        except KernelError as exc:
            del entry.versions[version]
            self._load_failed(entry, version, exc.message)
            return False
        except Exception as exc:  # noqa: BLE001
            del entry.versions[version]
            self._load_failed(entry, version, f"{type(exc).__name__}: {exc}")
            return False
        model.state = ModelState.READY
        entry.unavailable.pop(version, None)
        return True

    def _new_model(self, md: repository.ModelDir, cfg, version: int) -> Model:
        """A model version, not started yet (state LOADING)."""
        log.info("loading: %s:%d", md.name, version)
        source = self._source(md, cfg, version)
        return Model(source, config_pbtxt.config_to_dict(cfg), platform=cfg.platform or cfg.backend)

    async def _start_model(self, model: Model, md: repository.ModelDir) -> None:
        """Start a model version's instances and scheduler; raises when it cannot serve.

        It stays LOADING: the caller makes it READY when it may take requests.
        """
        cfg = model.config
        backend = self.backends.get(cfg.backend)
        started = time.monotonic()
        if model.is_ensemble:
            from kernel.core.scheduling.ensemble import wait_for_steps

            await wait_for_steps(self, model)
        else:
            model_file = backend.model_file(md.versions[model.version], cfg)
            if model_file is not None and not model_file.is_file():
                raise KernelError(ErrorCode.INVALID_ARG, f"unable to find '{model_file}' for model '{md.name}'")
            model.instances = await backend.load(model.source)
        model.stats.load_duration_s = time.monotonic() - started
        model.stats.observer = self.metrics_config.observer_for(model)
        for inst in model.instances:
            inst.stats = model.stats
        model.scheduler = make_scheduler(self, model)

    def _load_failed(self, entry, version: Optional[int], reason: str) -> None:
        entry.state = ModelState.UNAVAILABLE
        entry.reason = reason
        if version is not None:
            entry.unavailable[version] = reason
        where = f"'{entry.name}'" if version is None else f"'{entry.name}' version {version}"
        log.error("failed to load %s: %s", where, reason)

    # ---- model control: load and unload one model at run time ---------------
    # (SageMaker multi-model endpoints use these; the repository control API
    # will build on them.)

    async def load_model_from_path(self, name: str, path) -> None:
        """Load the model folder at `path` under `name`; raise KernelError if it cannot serve.

        ALREADY_EXISTS when `name` is loaded or being loaded. A model that fails
        to load leaves nothing behind in the registry.
        """
        path = Path(path)
        existing = self.registry.entries.get(name)
        if existing is not None and existing.state is not ModelState.UNAVAILABLE:
            raise KernelError(ErrorCode.ALREADY_EXISTS, f"model '{name}' is already loaded")
        if self._shutting_down:
            raise KernelError(ErrorCode.UNAVAILABLE, "Server is stopping; models cannot be loaded")
        try:
            md = await asyncio.to_thread(_scan_model_folder, path)
        except OSError as exc:
            raise KernelError(
                ErrorCode.INVALID_ARG, f"failed to load '{name}': cannot read model directory '{path}': {exc}"
            ) from None
        md.name = name
        self.registry.entries.pop(name, None)  # a previous failed or unloaded entry
        await self.load_model(md)
        entry = self.registry.entries.get(name)
        if entry is None or entry.state is not ModelState.READY:
            reason = entry.reason if entry is not None else "load was interrupted"
            if entry is not None:
                await self._stop_versions(list(entry.versions.values()), 0.0)
                if self.registry.entries.get(name) is entry:
                    del self.registry.entries[name]
            raise KernelError(ErrorCode.INVALID_ARG, f"failed to load '{name}': {reason}")

    async def unload_model(self, name: str) -> None:
        """Stop serving `name`: refuse new requests, let in-flight ones finish, stop its instances."""
        entry = self.registry.entries.get(name)
        if entry is None:
            raise KernelError(ErrorCode.NOT_FOUND, f"failed to unload '{name}': model is not loaded")
        if entry.state is ModelState.LOADING:
            raise KernelError(ErrorCode.UNAVAILABLE, f"failed to unload '{name}': model is still loading")
        if entry.state is ModelState.UNLOADING:
            raise KernelError(ErrorCode.UNAVAILABLE, f"failed to unload '{name}': model is already unloading")
        entry.state = ModelState.UNLOADING
        await self.retire_models(list(entry.versions.values()))
        if self.registry.entries.get(name) is entry:
            del self.registry.entries[name]

    async def retire_models(self, models: list[Model]) -> None:
        """Stop serving these versions: refuse new requests, let in-flight ones finish, stop the instances."""
        for m in models:
            m.state = ModelState.UNLOADING  # new requests are refused from here on
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.exit_timeout_secs
        while loop.time() < deadline and any(_has_work(m) for m in models):
            await asyncio.sleep(0.02)
        for m in models:
            if m.scheduler is not None:
                m.scheduler.close()
        await self._stop_versions(models, max(0.0, deadline - loop.time()))
        for m in models:
            m.state = ModelState.UNAVAILABLE
            log.info("successfully unloaded '%s' version %d", m.name, m.version)

    async def _stop_versions(self, models: list[Model], timeout: float) -> None:
        await asyncio.gather(
            *(inst.stop(timeout) for m in models for inst in m.instances), return_exceptions=True
        )

    def model_table(self) -> str:
        rows = []
        for name in sorted(self.registry.entries):
            e = self.registry.entries[name]
            if e.versions:
                for v, m in sorted(e.versions.items()):
                    rows.append((name, str(v), m.state.value if m.state is not ModelState.READY else "READY"))
            else:
                rows.append((name, "-", f"UNAVAILABLE: {e.reason}" if e.reason else e.state.value))
        return _table(("Model", "Version", "Status"), rows)

    # ---- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        self.live = True
        await self.load_repository()
        self.control.start_polling()

    async def start_transports(self) -> None:
        for t in self.transports:
            address = await t.start()
            log.info("Started %s at %s", t.service_name, address)
        self._listening = True

    async def stop(self) -> None:
        """Graceful shutdown: refuse new work, drain in-flight requests, finalize models."""
        self._shutting_down = True
        await self.control.stop()
        for t in self.transports:
            try:
                await t.stop()
            except Exception:  # noqa: BLE001
                log.exception("stopping %s failed", t.service_name)
        timeout = self.options.exit_timeout_secs
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        log.info("Waiting for in-flight requests to complete.")
        while self.in_flight() and loop.time() < deadline:
            await asyncio.sleep(0.02)
        remaining = self.in_flight()
        log.info("Timeout %d: Found %d in-flight requests", int(max(0, deadline - loop.time())), remaining)
        models = self.registry.all_models()
        for m in models:
            m.state = ModelState.UNLOADING
            if m.scheduler is not None:
                m.scheduler.close()
        await asyncio.gather(
            *(inst.stop(max(0.0, deadline - loop.time())) for m in models for inst in m.instances),
            return_exceptions=True,
        )
        for m in models:
            m.state = ModelState.UNAVAILABLE
            log.info("successfully unloaded '%s' version %d", m.name, m.version)
        self.shared_memory.close()
        await self.tracer.close()
        self.live = False


_now_ns = time.monotonic_ns


def _has_work(model: Model) -> bool:
    pending = getattr(model.scheduler, "pending_count", None)
    return bool((pending() if pending is not None else 0) or any(i.in_flight for i in model.instances))


def _copy_config(config):
    copy = type(config)()
    copy.CopyFrom(config)
    return copy


def _scan_model_folder(path: Path) -> repository.ModelDir:
    if not path.is_dir():
        raise FileNotFoundError("no such directory")
    return repository.scan_model_dir(path)


def _defines_auto_complete(model_file: Optional[Path]) -> bool:
    """Only spawn the auto-complete interpreter for models that define the hook."""
    if model_file is None:
        return False
    try:
        return "auto_complete_config" in model_file.read_text(errors="replace")
    except OSError:
        return False


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(row) -> str:
        return "|" + "|".join(f" {str(c):<{w}} " for c, w in zip(row, widths)) + "|"

    return "\n".join([line, fmt(header), line, *(fmt(r) for r in rows), line])
