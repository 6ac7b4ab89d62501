"""The one loader: how a model folder becomes serving model versions.

Every way a model gets loaded ends here: start-up and the model control modes, the repository
API and pb_utils.load_model (kernel.loading.control), SageMaker multi-model endpoints and
PyTriton's bind (`load_from_path`). It reads and completes the config (auto-complete through the
model's backend), starts each version's instances and scheduler, and records failures in the
registry with Triton's log lines. What to load when, and reloads, are kernel.loading.control's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from kernel.config import pbtxt as config_pbtxt
from kernel.core.backend import Backend, ModelSource
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.gpu import visible_gpu_ids
from kernel.core.model import Model, ModelState
from kernel.core.scheduling import make_scheduler
from kernel.core.scheduling.ensemble import wait_for_steps
from kernel.loading import repository
from kernel.loading.progress import load_progress
from kernel.loading.warmup import has_warmup, run_warmup
from kernel.observe.log import model_event

if TYPE_CHECKING:
    from kernel.core.server import Server

log = logging.getLogger("kernel.core.server")

# How long a version whose warmup failed may take to finalize its instances before they are killed.
WARMUP_FAILED_STOP_S = 5.0


class VersionLoadFailed(KernelError):
    """A failure before the versions load that tritonserver reports as one version's (auto-complete)."""

    def __init__(self, version: int, message: str) -> None:
        super().__init__(ErrorCode.INTERNAL, message)
        self.version = version


class ModelLoader:
    """Loads model folders into a server's registry (see the module docstring)."""

    def __init__(self, server: "Server"):
        self.server = server
        self.from_path: set[str] = set()  # names load_from_path serves (listed in the repository index)

    async def load(self, md: repository.ModelDir, config=None) -> None:
        """Load every version of a model that is not loaded; `config` overrides its config file."""
        entry = self.server.registry.entry(md.name)
        entry.state = ModelState.LOADING
        try:
            cfg = await self.complete_config(md, config)
            versions = repository.select_versions(cfg, sorted(md.versions))
        except VersionLoadFailed as exc:
            self._load_failed(entry, exc.version, exc.message)
            return
        except KernelError as exc:
            self._load_failed(entry, None, exc.message)
            return
        except Exception as exc:  # noqa: BLE001 - a broken model must never stop the others
            self._load_failed(entry, None, f"{type(exc).__name__}: {exc}")
            return
        results = await asyncio.gather(*(self._load_version(md, cfg, v) for v in versions))
        entry.state = ModelState.READY if any(results) else ModelState.UNAVAILABLE
        if entry.state is ModelState.READY:
            log.info("successfully loaded '%s'", md.name, extra=model_event(md.name, ModelState.READY.value))

    async def complete_config(self, md: repository.ModelDir, config=None):
        cfg = repository.load_model_config(md) if config is None else _copy_config(config)
        if cfg.name and md.name != md.path.name:
            # Loaded under another name (load_from_path): that name wins,
            # as with Triton's repository name mapping.
            cfg.name = md.name
        if cfg.platform == config_pbtxt.ENSEMBLE_PLATFORM:  # run by the core, no backend
            config_pbtxt.normalize_config(cfg, md.name, model_path=md.path)
            config_pbtxt.validate_config(cfg)
            return cfg
        backend = self._backend_for(cfg, md)
        # KIND_AUTO / KIND_GPU groups are resolved against the GPUs this server sees (probed lazily:
        # a CPU box only stats a device file).
        gpus = visible_gpu_ids()
        config_pbtxt.normalize_config(cfg, md.name, model_path=md.path, gpus=gpus)
        if not self.server.options.disable_auto_complete_config and not (
            self.server.options.strict_model_config and md.config_path is not None
        ):
            latest = max(md.versions) if md.versions else None
            if latest is not None and _defines_auto_complete(backend.model_file(md.versions[latest], cfg)):
                try:
                    completed = await backend.auto_complete(self._source(md, cfg, latest))
                except KernelError as exc:  # Triton runs auto_complete_config as the version's: its failure
                    raise VersionLoadFailed(latest, exc.message) from None
                if completed is not None:
                    config_pbtxt.apply_autocomplete(cfg, config_pbtxt.config_from_dict(completed))
                    config_pbtxt.normalize_config(cfg, md.name, model_path=md.path, gpus=gpus)
        config_pbtxt.validate_config(cfg, gpus=gpus)
        return cfg

    def _backend_for(self, cfg, md: repository.ModelDir) -> Backend:
        name = cfg.backend or ("python" if not cfg.platform else cfg.platform)
        backend = self.server.backends.get(name) or self._discover_backend(name, md)
        if not cfg.backend:
            cfg.backend = name
        backend.complete_config(cfg)
        return backend

    def _discover_backend(self, name: str, md: repository.ModelDir) -> Backend:
        """A backend that is not built in: ask the built-in ones to find it in the backend directory."""
        searched: list[str] = []
        directory = self.server.options.backend_directory
        if directory is not None and name and "/" not in name and "\\" not in name and name not in (".", ".."):
            for candidate in list(self.server.backends.values()):
                found, paths = candidate.discover(name, Path(directory))
                searched += paths
                if found is not None:
                    found.attach(self.server)
                    self.server.backends[name] = found
                    return found
        where = f"; searched: {', '.join(repr(p) for p in searched)}" if searched else ""
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"unable to find backend '{name}' for model '{md.name}'{where} (Kernel serves Python-based backends "
            f"from --backend-directory; it does not load C++ backend libraries such as libtriton_{name}.so); "
            "available backends: " + ", ".join(sorted(self.server.backends)),
        )

    def _source(self, md: repository.ModelDir, cfg, version: int) -> ModelSource:
        backend = self.server.backends.get(cfg.backend)
        return ModelSource(
            name=md.name,
            version=version,
            model_dir=md.path,
            version_dir=md.versions[version],
            repository=md.path.parent,
            config=cfg,
            config_json=config_pbtxt.config_to_json(cfg),
            backend_config=self.server.options.backend_config.get(backend.name, {}) if backend is not None else {},
        )

    async def _load_version(self, md: repository.ModelDir, cfg, version: int) -> bool:
        entry = self.server.registry.entry(md.name)
        model = self.new_model(md, cfg, version)
        entry.versions[version] = model
        try:
            await self.start_model(model, md)
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

    def new_model(self, md: repository.ModelDir, cfg, version: int) -> Model:
        """A model version, not started yet (state LOADING)."""
        log.info("loading: %s:%d", md.name, version, extra=model_event(md.name, ModelState.LOADING.value, version))
        source = self._source(md, cfg, version)
        return Model(source, config_pbtxt.config_to_dict(cfg), platform=cfg.platform or cfg.backend)

    async def start_model(self, model: Model, md: repository.ModelDir) -> None:
        """Start a model version's instances and scheduler; raises when it cannot serve.

        It stays LOADING: the caller makes it READY when it may take requests.
        """
        cfg = model.config
        backend = self.server.backends.get(cfg.backend)
        started = time.monotonic()
        async with load_progress(model.name, model.version):  # "still loading ..." for long loads
            if model.is_ensemble:
                await wait_for_steps(self.server, model)
            else:
                model_file = backend.model_file(md.versions[model.version], cfg)
                if model_file is not None and not model_file.is_file():
                    raise KernelError(ErrorCode.INVALID_ARG, _missing_model_file(model_file, cfg.backend, md.name))
                model.instances = await backend.load(model.source)
            model.stats.observer = self.server.metrics_config.observer_for(model)
            for inst in model.instances:
                inst.stats = model.stats
            if has_warmup(model):  # before READY; counted in the statistics, as in Triton
                try:
                    await run_warmup(model)
                except BaseException:
                    await self.server.stop_versions([model], WARMUP_FAILED_STOP_S)
                    raise
        model.stats.load_duration_s = time.monotonic() - started
        model.scheduler = make_scheduler(self.server, model)
        if cfg.response_cache.enable:  # None when the server runs without --cache-config
            model.response_cache = self.server.response_cache

    def _load_failed(self, entry, version: Optional[int], reason: str) -> None:
        entry.state = ModelState.UNAVAILABLE
        entry.reason = reason
        if version is not None:
            entry.unavailable[version] = reason
        where = f"'{entry.name}'" if version is None else f"'{entry.name}' version {version}"
        log.error("failed to load %s: %s", where, reason,
                  extra=model_event(entry.name, ModelState.UNAVAILABLE.value, version, reason))

    # ---- one model folder at run time (SageMaker multi-model endpoints, PyTriton's bind) ----

    async def load_from_path(self, name: str, path) -> None:
        """Load the model folder at `path` under `name`; raise KernelError if it cannot serve.

        ALREADY_EXISTS when `name` is loaded or being loaded. A model that fails
        to load leaves nothing behind in the registry.
        """
        path = Path(path)
        existing = self.server.registry.entries.get(name)
        if existing is not None and existing.state is not ModelState.UNAVAILABLE:
            raise KernelError(ErrorCode.ALREADY_EXISTS, f"model '{name}' is already loaded")
        if self.server.stopping:
            raise KernelError(ErrorCode.UNAVAILABLE, "Server is stopping; models cannot be loaded")
        try:
            md = await asyncio.to_thread(_scan_model_folder, path)
        except OSError as exc:
            raise KernelError(
                ErrorCode.INVALID_ARG, f"failed to load '{name}': cannot read model directory '{path}': {exc}"
            ) from None
        md.name = name
        self.server.registry.entries.pop(name, None)  # a previous failed or unloaded entry
        await self.load(md)
        entry = self.server.registry.entries.get(name)
        if entry is None or entry.state is not ModelState.READY:
            reason = entry.reason if entry is not None else "load was interrupted"
            if entry is not None:
                await self.server.stop_versions(list(entry.versions.values()), 0.0)
                if self.server.registry.entries.get(name) is entry:
                    del self.server.registry.entries[name]
            raise KernelError(ErrorCode.INVALID_ARG, f"failed to load '{name}': {reason}")
        self.from_path.add(name)

    async def unload_from_path(self, name: str) -> None:
        """Stop serving `name`: refuse new requests, let in-flight ones finish, stop its instances."""
        entry = self.server.registry.entries.get(name)
        if entry is None:
            raise KernelError(ErrorCode.NOT_FOUND, f"failed to unload '{name}': model is not loaded")
        if entry.state is ModelState.LOADING:
            raise KernelError(ErrorCode.UNAVAILABLE, f"failed to unload '{name}': model is still loading")
        if entry.state is ModelState.UNLOADING:
            raise KernelError(ErrorCode.UNAVAILABLE, f"failed to unload '{name}': model is already unloading")
        entry.state = ModelState.UNLOADING
        self.from_path.discard(name)
        await self.server.retire_models(list(entry.versions.values()))
        if self.server.registry.entries.get(name) is entry:
            del self.server.registry.entries[name]


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


def _missing_model_file(model_file: Path, backend: str, model_name: str) -> str:
    """Why a version without its model file fails, in the words tritonserver users find in its log.

    Triton's Python backend stub says it ("Failed to preinitialize Python stub: Python model file
    not found in '<path>'", then 2.51 leaves the load hanging where Kernel fails it at once); other
    backends get the core's words.
    """
    if backend == config_pbtxt.PYTHON_BACKEND:
        return f"Failed to preinitialize Python stub: Python model file not found in '{model_file}'"
    return f"unable to find '{model_file}' for model '{model_name}'"
