"""The Python backend: every model instance is a worker process running model.py."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import weakref
from pathlib import Path
from typing import Any, Optional

import msgspec

from kernel.backends.python.execenv import PARAMETER as EXECUTION_ENV_PATH
from kernel.backends.python.execenv import ExecutionEnvironments
from kernel.backends.python.instance import WorkerFacts, WorkerInstance, WorkerSettings
from kernel.backends.python.link import LinkedInstance
from kernel.backends.python.messages import LogSettings
from kernel.core.backend import Backend, BackendInstance, ModelSource
from kernel.core.errors import ErrorCode, KernelError

log = logging.getLogger("kernel.python")

_KIND_NAMES = {0: "AUTO", 1: "GPU", 2: "CPU", 3: "MODEL"}

# --backend-config python,<key>=<value> settings this backend understands.
_SETTINGS = {
    "shm-default-byte-size": ("shm_default_byte_size", int),
    "shm-growth-byte-size": ("shm_growth_byte_size", int),
    "stub-timeout-seconds": ("stub_timeout_seconds", float),
    "request-age-warning-seconds": ("request_age_warning_seconds", float),  # Kernel only (age_watch.py)
    "shm-idle-release-seconds": ("shm_idle_release_seconds", float),  # Kernel only (arena_trim.py)
}
# Accepted for compatibility with tritonserver; they change nothing here.
_ACCEPTED = {"shm-region-prefix-name", "default-max-batch-size"}
# Kernel only: where execution-environment tarballs are unpacked (see execenv.py).
_ENV_CACHE_SETTING = "execution-env-cache-directory"


def settings_from_backend_config(values: dict[str, str], log: Optional[LogSettings] = None) -> WorkerSettings:
    kwargs: dict = {"log": log or LogSettings()}
    for key, value in values.items():
        if key in _SETTINGS:
            field, parse = _SETTINGS[key]
            try:
                kwargs[field] = parse(value)
            except ValueError:
                raise KernelError(
                    ErrorCode.INVALID_ARG, f"invalid value '{value}' for python backend setting '{key}'"
                ) from None
        elif key not in _ACCEPTED:
            # (module logger by its full name: the `log` argument is the workers' log settings)
            logging.getLogger("kernel.python").warning("python backend: unknown setting '%s' ignored", key)
    return WorkerSettings(**kwargs)


class PythonBackend(Backend):
    name = "python"
    # Called with a WorkerInstance whose worker was started again after it died (a supervisor of
    # several front processes gives each front a new link to it: kernel.serve.fronts).
    on_restarted = None

    def __init__(self, backend_config: Optional[dict[str, str]] = None, log: Optional[dict] = None):
        """log: the server's log settings (verbose, info, warning, error, format), mirrored in workers."""
        values = dict(backend_config or {})
        cache_dir = values.pop(_ENV_CACHE_SETTING, None)
        self.settings = settings_from_backend_config(values, LogSettings(**(log or {})))
        self.envs = ExecutionEnvironments(Path(cache_dir) if cache_dir else None)
        self._restarting: set[str] = set()

    def discover(self, name: str, backend_directory: Path):
        """Python-based backends: <backend_directory>/<name>/model.py."""
        folder = Path(backend_directory) / name
        candidate = folder / MODEL_FILE
        if candidate.is_file():
            return PythonBasedBackend(self, name, Path(os.path.abspath(folder))), [str(candidate)]
        return None, [str(candidate)]

    async def auto_complete(self, source: ModelSource) -> Optional[dict]:
        model_file = self.model_file(source.version_dir, source.config)
        command = await self.envs.command_for(source)
        argv, env = command.module("kernel.backends.python.autocomplete", "--model-file", str(model_file))
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
        )
        try:
            out, _ = await asyncio.wait_for(
                proc.communicate(source.config_json.encode()), self.settings.stub_timeout_seconds
            )
        except asyncio.TimeoutError:
            proc.kill()
            raise KernelError(ErrorCode.INTERNAL, "auto-complete of the model config timed out") from None
        except asyncio.CancelledError:  # the load was abandoned
            proc.kill()
            raise
        try:
            result = json.loads(out or b"{}")
        except ValueError:
            result = {"error": f"auto-complete process exited with code {proc.returncode}"}
        if "error" in result or "config" not in result:
            raise KernelError(
                ErrorCode.INTERNAL,
                "Internal: " + result.get("error", f"exited with code {proc.returncode}"),  # Triton's framing
            )
        return result["config"]

    def instance_specs(self, source: ModelSource) -> list[tuple[str, str, int]]:
        """(instance name, kind, device id) for every instance the config asks for.

        A KIND_GPU group gives one instance per (count, GPU), as Triton does: `count: 2 gpus: [0, 1]`
        is four workers, named "<group>_<c>" (the name repeats across GPUs, as in Triton) and told
        their device in initialize(args). The config was completed and validated against the
        server's GPUs (kernel.core.gpu) before this, so KIND_AUTO is resolved and every id exists.
        """
        specs = []
        for group in source.config.instance_group:
            kind = _KIND_NAMES.get(group.kind, "CPU")
            if kind == "GPU" and not group.gpus:
                # Only reached if a config skipped validation; Triton's words for it.
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"instance group {group.name} of model {source.name} has kind KIND_GPU "
                    "but no GPUs are available",
                )
            kind = "CPU" if kind in ("AUTO", "CPU") else kind
            for i in range(group.count or 1):
                if kind == "GPU":
                    specs.extend((f"{group.name}_{i}", "KIND_GPU", gpu) for gpu in group.gpus)
                else:
                    specs.append((f"{group.name}_{i}", f"KIND_{kind}", 0))
        return specs

    async def load(self, source: ModelSource) -> list[BackendInstance]:
        force_cpu_only_input_tensors(source.config)
        specs = self.instance_specs(source)
        command = await self.envs.command_for(source)
        instances = [WorkerInstance(source, name, kind, dev, self.settings, self.core) for name, kind, dev in specs]
        self._live_instances().update(instances)
        for inst in instances:
            inst.on_unexpected_exit = self._restart
            inst.command = command
            inst.model_file = self.model_file(source.version_dir, source.config)
        try:
            results = await asyncio.gather(*(inst.start() for inst in instances), return_exceptions=True)
        except asyncio.CancelledError:  # the load was abandoned (a signal during start-up): end its workers
            await asyncio.gather(*(inst.stop(0) for inst in instances), return_exceptions=True)
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for inst in instances:
                inst._stopping = True
            await asyncio.gather(*(inst.stop(0) for inst in instances), return_exceptions=True)
            err = errors[0]
            if isinstance(err, KernelError):
                raise err
            raise KernelError(ErrorCode.INTERNAL, f"{type(err).__name__}: {err}")
        return instances

    async def linked_instances(
        self, source: ModelSource, links: list[tuple[int, socket.socket, socket.socket, WorkerFacts]],
    ) -> list[LinkedInstance]:
        """This front process's instances of a model version whose workers another process owns
        (several front processes, issue 32): one per (link id, channel socket, fd socket, facts),
        as WorkerInstance.open_link and WorkerInstance.facts give them, connected and healthy.
        Their restarts are the owner's (LinkedInstance.replace); stop() closes the link only."""
        instances = [
            LinkedInstance(source, facts.name, facts.kind, facts.device_id, self.settings, self.core, link_id,
                           channel_sock, fd_sock, facts)
            for link_id, channel_sock, fd_sock, facts in links
        ]
        try:
            await asyncio.gather(*(inst.start() for inst in instances))
        except BaseException:
            await asyncio.gather(*(inst.stop(0) for inst in instances), return_exceptions=True)
            raise
        return instances

    def _live_instances(self) -> "weakref.WeakSet[WorkerInstance]":
        live = getattr(self, "_live", None)  # (Python-based backends skip __init__)
        if live is None:
            live = self._live = weakref.WeakSet()
        return live

    def update_log_settings(self, settings) -> None:
        """kernel.observe.log.LogSettings changed: every worker of this backend, now and later, follows."""
        log_settings = LogSettings(
            verbose=settings.verbose, info=settings.info, warning=settings.warning, error=settings.error,
            format=settings.format, file=settings.file,
        )
        self.settings = msgspec.structs.replace(self.settings, log=log_settings)
        for instance in list(self._live_instances()):
            instance.update_log_settings(log_settings)

    def _restart(self, instance: WorkerInstance) -> None:
        """A worker died (crash, os._exit, OOM): bring a fresh one up in its place."""
        if instance.name in self._restarting:
            return
        self._restarting.add(instance.name)

        async def restart() -> None:
            delay = 0.1
            try:
                while not instance._stopping:
                    try:
                        await instance.restart()
                        log.info("Stub process '%s' restarted", instance.name)
                        if self.on_restarted is not None:
                            self.on_restarted(instance)
                        return
                    except Exception as exc:  # noqa: BLE001
                        log.error("restarting stub process '%s' failed: %s", instance.name, exc)
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 5.0)
            finally:
                self._restarting.discard(instance.name)

        asyncio.ensure_future(restart())


# ---- Python-based backends -------------------------------------------------
# `<backend-directory>/<name>/model.py` serves every model whose config says `backend: "<name>"`.
# Such a backend is the Python backend with a different model file: the backend's own model.py is
# always the one run (a model.py in the model's version folder is ignored), while `initialize(args)`
# still sees the model's own name, repository and version, and `pb_utils.get_model_dir()` the model's
# version folder. It shares the Python backend's settings (`--backend-config python,...`), as in
# Triton. When the backend folder holds `pb_exec_env_model.py.tar.gz` and the model names no
# EXECUTION_ENV_PATH, the model runs in that environment.

MODEL_FILE = "model.py"


class PythonBasedBackend(PythonBackend):
    def __init__(self, base: PythonBackend, name: str, directory: Path):
        # Not PythonBackend.__init__: settings and the environment cache are the base's.
        self.name = name
        self.directory = directory
        self.settings = base.settings
        self.envs = base.envs
        self._restarting = set()
        self.on_restarted = base.on_restarted

    def model_file(self, version_dir: Path, config: Any) -> Optional[Path]:
        return self.directory / MODEL_FILE

    def discover(self, name: str, backend_directory: Path) -> tuple[Optional[Backend], list[str]]:
        return None, []  # the Python backend itself does the looking

    def complete_config(self, config: Any) -> None:
        if not config.runtime:
            config.runtime = MODEL_FILE
        if EXECUTION_ENV_PATH not in config.parameters:
            bundled = self.directory / f"pb_exec_env_{config.runtime}.tar.gz"
            if bundled.is_file():
                config.parameters[EXECUTION_ENV_PATH].string_value = str(bundled)


def force_cpu_only_input_tensors(config) -> bool:
    """The model's FORCE_CPU_ONLY_INPUT_TENSORS parameter: "yes" (the default) or "no", as Triton reads it.

    With "no", GPU inputs (a CUDA shared-memory region, another model's GPU output) reach execute
    on the GPU, as CUDA IPC handles the worker opens (gpu_worker.py, which reads the parameter from
    the model config itself); with "yes" the worker copies them to the host. Checked here so that a
    bad value fails the load in tritonserver 2.51's words and "no" logs its line, as there.
    """
    param = config.parameters.get("FORCE_CPU_ONLY_INPUT_TENSORS")
    if param is None or param.string_value == "yes":
        return True
    if param.string_value == "no":
        log.info("Input tensors can be both in CPU and GPU. FORCE_CPU_ONLY_INPUT_TENSORS is off.")
        return False
    raise KernelError(
        ErrorCode.UNSUPPORTED, f"Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: {param.string_value}'"
    )

