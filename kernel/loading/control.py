"""Model control: which models are loaded when, and the model repository extension.

Modes (--model-control-mode, as tritonserver's):

- none: every model is loaded at start-up and nothing changes afterwards;
  load and unload requests are refused.
- poll: every model is loaded at start-up, then the repositories are read
  again every --repository-poll-secs; models and versions that were added,
  changed or removed are loaded, reloaded or unloaded, and nothing else is
  touched. Load and unload requests are refused.
- explicit: only the --load-model models are loaded at start-up ('*': all);
  afterwards only what load/unload requests ask for (HTTP, gRPC, and
  pb_utils.load_model/unload_model from inside models).

A reload never interrupts service: the new versions start beside the old
ones, which keep serving until every new version is ready; then new requests
go to the new versions and the old ones finish what they hold before they are
stopped. A reload that fails leaves the old versions serving. A version whose
files and config did not change is kept as it is.

`ModelControl` is the transport-neutral API: `index`, `load`, `unload`,
`is_ready`. Transports only turn their wire format into these calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from kernel.config import pbtxt as config_pbtxt

from kernel.loading import repository
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.model import Model, ModelState
from kernel.loading.loader import ModelLoader, VersionLoadFailed
from kernel.loading.names import parse_version, printable, validate_model_name
from kernel.loading.files import (
    Fingerprint,
    fingerprint_or_none,
    fingerprints,
    remove_override_folder,
    write_override_folder,
)
from kernel.core.registry import UNLOADED
from kernel.observe.log import model_event

if TYPE_CHECKING:
    from kernel.core.server import Server

log = logging.getLogger("kernel.core.server")


class ControlMode(str, enum.Enum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


LOAD_ALL = "*"
NOT_ALLOWED = "explicit model load / unload is not allowed if polling is enabled"
DUPLICATE = "model appears in two or more repositories"
@dataclass
class _Tracked:
    """What model control knows of a model it loaded (or tried to)."""

    path: Path  # the model folder its versions were loaded from
    served: Optional[Fingerprint]  # the files its serving versions came from; None: nothing serves
    attempted: Optional[Fingerprint]  # the files of the last load attempt (poll mode retries after a change)
    explicit: bool  # asked for by name (not only loaded as an ensemble's step)
    config_override: bool = False  # its config came from a load request, not its folder
    override_folder: Optional[Path] = None  # a temporary folder from `file:` parameters, deleted when replaced


class ModelControl:
    def __init__(self, server: "Server", loader: Optional[ModelLoader] = None):
        self.server = server
        self.loader = loader or ModelLoader(server)
        options = server.options
        self.mode = ControlMode(options.model_control_mode)
        self.poll_secs = float(options.repository_poll_secs)
        self.tracked: dict[str, _Tracked] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._background: set[asyncio.Task] = set()
        self._poll_task: Optional[asyncio.Task] = None
        self._stopping: Optional[asyncio.Event] = None
        self.after_change = None  # awaited after any change to what is served: fronts learn it (fronts/hub.py)

    # ---- start-up, polling, shutdown ---------------------------------------------

    async def load_startup_models(self) -> bool:
        """Load what the mode loads at start-up. False when a --load-model model was not found."""
        dirs, duplicates = await asyncio.to_thread(repository.scan_repositories, self.server.options.model_repositories, self.server.options.model_config_name or None)
        names = sorted(dirs)
        all_found = True
        if self.mode is ControlMode.EXPLICIT:
            wanted = list(dict.fromkeys(self.server.options.startup_models))
            if LOAD_ALL in wanted:
                if len(wanted) > 1:
                    from kernel.core.server import StartupError

                    raise StartupError("Wildcard model name '*' must be the ONLY startup model if specified at all.")
                wanted = sorted(set(dirs) | set(duplicates))
            for name in wanted:
                try:
                    validate_model_name(name)
                except KernelError as exc:
                    log.error("failed to poll model '%s': %s", printable(name), exc.message)
                    all_found = False
                    continue
                if name not in dirs and name not in duplicates:
                    log.error("failed to poll model '%s': model not found in any model repository.", name)
                    all_found = False
            explicit = {n for n in wanted if n in dirs or n in duplicates}
            names = sorted(await asyncio.to_thread(repository.with_steps, explicit, dirs))
        else:
            explicit = set(names) | set(duplicates)
        clash = sorted(explicit & set(duplicates))
        if clash:
            from kernel.core.server import StartupError

            roots = " and ".join(str(r) for r in duplicates[clash[0]])
            raise StartupError(f"model '{clash[0]}' appears in two repositories: {roots}")
        prints: dict[str, Optional[Fingerprint]] = {}
        if self.mode is not ControlMode.NONE:
            prints = await asyncio.to_thread(fingerprints, {n: dirs[n] for n in names})
        async with contextlib.AsyncExitStack() as held:
            # Kernel listens while these load: a repository load or unload of one of them (explicit
            # mode) waits for its start-up load, as the repository API's own loads wait for each other,
            # instead of racing it (an unload answered at once, then the start-up load made it READY).
            for name in names:
                await held.enter_async_context(self._lock(name))
            await asyncio.gather(*(self.loader.load(dirs[n]) for n in names))
            if self.mode is not ControlMode.NONE:
                for name in names:
                    entry = self.server.registry.entries.get(name)
                    serving = entry is not None and entry.latest_ready() is not None
                    fp = prints.get(name)
                    self.tracked[name] = _Tracked(dirs[name].path, fp if serving else None, fp, name in explicit)
        return all_found

    def start_polling(self) -> None:
        if self.mode is ControlMode.POLL and self.poll_secs > 0 and self._poll_task is None:
            self._stopping = asyncio.Event()
            self._poll_task = asyncio.ensure_future(self._poll_forever(self._stopping))

    async def stop(self) -> None:
        """Stop polling and let unloads in progress finish (each is bounded by --exit-timeout-secs)."""
        if self._poll_task is not None:
            # Not cancelled: a poll that is loading models finishes, so no half-started worker is left behind.
            self._stopping.set()
            await self._poll_task
            self._poll_task = None
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        folders = [t.override_folder for t in self.tracked.values() if t.override_folder is not None]
        for folder in folders:
            await asyncio.to_thread(remove_override_folder, folder)

    async def _poll_forever(self, stopping: asyncio.Event) -> None:
        while True:
            try:
                await asyncio.wait_for(stopping.wait(), self.poll_secs)
                return
            except asyncio.TimeoutError:
                pass
            try:
                await self.poll()
            except Exception:  # noqa: BLE001 - the next poll tries again
                log.exception("failed to poll model repository")
            await self._changed()

    async def poll(self) -> None:
        """One look at the repositories: load added, reload changed and unload removed models."""
        if self.server.stopping:
            return
        try:
            dirs, duplicates = await asyncio.to_thread(repository.scan_repositories, self.server.options.model_repositories, self.server.options.model_config_name or None)
        except (OSError, KernelError) as exc:
            log.error("failed to poll model repository: %s", getattr(exc, "message", exc))
            return
        for name in duplicates:
            log.error("failed to poll model '%s': not unique across all model repositories", name)
        prints = await asyncio.to_thread(fingerprints, dirs)
        removed = [n for n in self.tracked if n not in dirs]
        for name in self._with_dependent_ensembles(removed):
            log.info("model '%s' was removed from the model repository", name)
            await self._unload_now(name)
        changed = []
        for name, md in dirs.items():
            fp = prints.get(name)
            tracked = self.tracked.get(name)
            if fp is None:  # it changed while being read: look again next time
                continue
            if tracked is None or tracked.attempted != fp or tracked.path != md.path:
                changed.append(name)
        if changed:
            results = await asyncio.gather(
                *(self._load_locked(n, dirs[n], prints[n], None, None, True) for n in changed),
                return_exceptions=True,
            )
            for name, result in zip(changed, results):
                if isinstance(result, BaseException) and not isinstance(result, KernelError):
                    log.error("failed to load '%s': %s: %s", name, type(result).__name__, result)

    # ---- the repository API --------------------------------------------------------

    async def index(self, ready_only: bool = False) -> list[dict]:
        """The repository index: every model folder of every repository, with its versions' states."""
        names, duplicates = await asyncio.to_thread(repository.folder_names, self.server.options.model_repositories)
        # and the models loaded from a folder of their own (SageMaker multi-model endpoints): tritonserver
        # registers that folder as a repository, so its index lists them too
        names = names | {n for n in self.loader.from_path if n in self.server.registry.entries}
        out: list[dict] = []
        for name in sorted(names | duplicates):
            if name in duplicates:
                if not ready_only:
                    out.append({"name": name, "state": ModelState.UNAVAILABLE.value, "reason": DUPLICATE})
                continue
            entry = self.server.registry.entries.get(name)
            if entry is None:
                if not ready_only:
                    out.append({"name": name})
                continue
            versions = sorted(set(entry.versions) | set(entry.unavailable))
            if not versions:
                if not ready_only:
                    row = {"name": name, "state": entry.state.value}
                    if entry.reason:
                        row["reason"] = entry.reason
                    out.append(row)
                continue
            for v in versions:
                model = entry.versions.get(v)
                state, reason = (model.state.value, model.reason) if model else ("UNAVAILABLE", entry.unavailable[v])
                if ready_only and state != ModelState.READY.value:
                    continue
                row = {"name": name, "version": str(v), "state": state}
                if reason:
                    row["reason"] = reason
                out.append(row)
        return out

    async def load(self, name: str, config: Optional[str] = None, files: Optional[dict[str, bytes]] = None) -> None:
        """Load `name`, or reload it if it changed (explicit mode). Raises KernelError with Triton's messages.

        `config`: a JSON model config used instead of the folder's config file.
        `files`: {"file:<path>": contents} forming the whole model folder (then
        `config` is required). Loading an ensemble loads its steps too.
        """
        self._check_allowed()
        validate_model_name(name)
        if self.server.stopping:
            raise KernelError(ErrorCode.UNAVAILABLE, "Server is stopping; models cannot be loaded")
        override = None
        if config:
            try:
                override = config_pbtxt.config_from_json(config)
            except KernelError as exc:
                raise _poll_failed(name, f"Invalid config override: {exc.message}") from None
        if files and override is None:
            raise _poll_failed(name, "Load parameter 'config' must be specified for model file override")
        try:
            await self._load_with_steps(name, override, files or None, explicit=True, visiting=set())
        finally:
            await self._changed()

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload `name` (explicit mode): new requests are refused at once, in-flight ones finish.

        Ensembles that use it are unloaded with it. With `unload_dependents`,
        the steps of an unloaded ensemble that were loaded only for it go too.
        Unloading a model that is not loaded succeeds and does nothing.
        """
        self._check_allowed()
        validate_model_name(name)
        targets = self._with_dependent_ensembles([name])
        if unload_dependents:
            targets = self._with_unneeded_steps(targets)
        try:
            for target in targets:
                await self._unload_now(target)
        finally:
            await self._changed()

    async def load_from_path(self, name: str, path) -> None:
        """Load the model folder at `path` under `name` (SageMaker multi-model endpoints, PyTriton's
        bind), in any control mode; KernelError when it cannot serve (see ModelLoader.load_from_path)."""
        try:
            await self.loader.load_from_path(name, path)
        finally:
            await self._changed()

    async def unload_from_path(self, name: str) -> None:
        """Unload a model that load_from_path loaded: in-flight requests finish first."""
        try:
            await self.loader.unload_from_path(name)
        finally:
            await self._changed()

    async def _changed(self) -> None:
        if self.after_change is not None:
            await self.after_change()

    async def is_ready(self, name: str, version: str = "") -> bool:
        """pb_utils.is_model_ready: allowed in every mode."""
        return await self.server.model_ready(name, parse_version(version))

    def validate_name(self, name: str) -> None:
        """The model name rules (kernel.loading.names), for transports that name models themselves
        (SageMaker's multi-model endpoint) and must not import the loading layer."""
        validate_model_name(name)

    # ---- loading -------------------------------------------------------------------

    def _check_allowed(self) -> None:
        if self.mode is not ControlMode.EXPLICIT:
            raise KernelError(ErrorCode.UNAVAILABLE, NOT_ALLOWED)

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    async def _load_with_steps(self, name, override, files, explicit: bool, visiting: set) -> None:
        if name in visiting:  # a cycle of ensembles: the ensemble's own load reports it
            return
        visiting.add(name)
        folder = None
        if files:
            try:
                folder = await asyncio.to_thread(write_override_folder, name, override, files)
            except KernelError as exc:
                raise _poll_failed(name, exc.message) from None
            md = await asyncio.to_thread(repository.scan_model_dir, folder)
        else:
            md = await self._locate(name)
        try:
            if override is not None:
                cfg = override
            else:
                cfg, unreadable = await asyncio.to_thread(repository.config_or_parse_error, md)
                if unreadable is not None:
                    # tritonserver: a config.pbtxt it cannot parse fails the poll (500), and the
                    # model is left as it was (the index lists its name only).
                    raise _poll_failed(name, unreadable, ErrorCode.INTERNAL)
            if cfg is not None and cfg.name and cfg.name != name:
                # Found when tritonserver polls the folder, before any load: its words say
                # "failed to load" (scripts match them), not a version's failure.
                raise _poll_failed(name, config_pbtxt.folder_name_mismatch(name, cfg.name))
            if cfg is not None and cfg.HasField("ensemble_scheduling"):
                for step in dict.fromkeys(s.model_name for s in cfg.ensemble_scheduling.step):
                    try:
                        validate_model_name(step)
                        await self._load_with_steps(step, None, None, False, visiting)
                    except KernelError as exc:  # the ensemble's own load says what is missing
                        log.error("failed to load '%s' (a step of ensemble '%s'): %s", step, name, exc.message)
            fp = await asyncio.to_thread(fingerprint_or_none, md)
        except BaseException:
            if folder is not None:
                await asyncio.to_thread(remove_override_folder, folder)
            raise
        await self._load_locked(name, md, fp, override, folder, explicit)

    async def _locate(self, name: str) -> repository.ModelDir:
        roots = await asyncio.to_thread(repository.folders_named, self.server.options.model_repositories, name)
        if len(roots) > 1:
            raise _poll_failed(name, "not unique across all model repositories", ErrorCode.INTERNAL, found=False)
        if not roots:
            raise _poll_failed(name, "model not found in any model repository.", found=False)
        try:
            return await asyncio.to_thread(
                repository.scan_model_dir, roots[0] / name, self.server.options.model_config_name or None
            )
        except OSError as exc:
            raise _poll_failed(name, f"cannot read model directory: {exc}", ErrorCode.INTERNAL) from None

    async def _load_locked(self, name, md, fp, override, folder, explicit: bool) -> None:
        try:
            async with self._lock(name):
                await self._apply(name, md, fp, override, folder, explicit)
        except BaseException:
            if folder is not None:
                await asyncio.to_thread(remove_override_folder, folder)
            raise

    async def _apply(self, name, md, fp, override, folder, explicit: bool) -> None:
        """Make `name` serve what `md` holds: load it, reload what changed, or nothing when nothing did."""
        server = self.server
        tracked = self.tracked.get(name)
        entry = server.registry.entry(name)
        live = {v: m for v, m in entry.versions.items() if m.state is ModelState.READY}
        if (
            live and tracked is not None and tracked.served is not None and tracked.served == fp
            and tracked.path == md.path and override is None and not tracked.config_override
        ):
            tracked.explicit = tracked.explicit or explicit
            tracked.attempted = fp
            return
        if not live:
            # Nothing serves: show it LOADING at once (ensembles being loaded beside it wait for that).
            entry.state = ModelState.LOADING
            entry.reason = ""
        try:
            # The config file is read in a thread: runtime loads must not block the event loop.
            base = override if override is not None else await asyncio.to_thread(repository.load_model_config, md)
            cfg = await self.loader.complete_config(md, base)
            wanted = repository.select_versions(cfg, sorted(md.versions))
        except Exception as exc:  # noqa: BLE001 - reported to the caller, the old versions keep serving
            reason = exc.message if isinstance(exc, KernelError) else f"{type(exc).__name__}: {exc}"
            self._failed(name, entry, live, fp, md, explicit)
            if isinstance(exc, VersionLoadFailed):  # Triton's framing: the version's failure
                entry.unavailable[exc.version] = reason
                if not live:
                    entry.state = ModelState.UNAVAILABLE
                    entry.reason = reason
                log.error("failed to load '%s' version %d: %s", name, exc.version, reason,
                          extra=model_event(name, ModelState.UNAVAILABLE.value, exc.version, reason))
                raise KernelError(ErrorCode.INVALID_ARG, f"load failed for model '{name}': version {exc.version} "
                                  f"is at UNAVAILABLE state: {reason};\n") from None
            if not live:
                entry.state = ModelState.UNAVAILABLE
                entry.reason = reason
            log.error("failed to load '%s': %s", name, reason, extra=model_event(name, ModelState.UNAVAILABLE.value,
                                                                                 reason=reason))
            raise KernelError(ErrorCode.INVALID_ARG, f"load failed for model '{name}': {reason}\n") from None
        comparable = _comparable(config_pbtxt.config_to_dict(cfg))
        same_folder = tracked is not None and tracked.served is not None and fp is not None and tracked.path == md.path
        keep = {
            v for v in wanted
            if v in live and same_folder and fp.same_version(tracked.served, v)
            and _comparable(live[v].config_dict) == comparable
        }
        fresh = {v: self.loader.new_model(md, cfg, v) for v in wanted if v not in keep}
        for v, model in fresh.items():
            if v not in live:  # nothing serves this version: it shows as LOADING meanwhile
                entry.versions[v] = model
        results = await asyncio.gather(*(self.loader.start_model(m, md) for m in fresh.values()), return_exceptions=True)
        failures = {
            v: (r.message if isinstance(r, KernelError) else f"{type(r).__name__}: {r}")
            for v, r in zip(fresh, results) if isinstance(r, BaseException)
        }
        if failures:
            for v, model in fresh.items():
                if entry.versions.get(v) is model:
                    del entry.versions[v]
                if v in failures:
                    entry.unavailable[v] = failures[v]
                    log.error("failed to load '%s' version %d: %s", name, v, failures[v],
                              extra=model_event(name, ModelState.UNAVAILABLE.value, v, failures[v]))
            self._retire_in_background([m for v, m in fresh.items() if v not in failures])
            self._failed(name, entry, live, fp, md, explicit)
            if not live:
                entry.state = ModelState.UNAVAILABLE
                entry.reason = failures[min(failures)]
            detail = "".join(f"version {v} is at UNAVAILABLE state: {r};" for v, r in sorted(failures.items()))
            log.info("failed to load '%s'", name)
            raise KernelError(ErrorCode.INVALID_ARG, f"load failed for model '{name}': {detail}\n")
        # Every new version is ready: switch over.
        retired: list[Model] = []
        for v, model in fresh.items():
            model.state = ModelState.READY
            old = entry.versions.get(v)
            entry.versions[v] = model
            entry.unavailable.pop(v, None)
            if old is not None and old is not model:
                retired.append(old)
        for v, old in live.items():
            if v not in wanted:
                if entry.versions.get(v) is old:
                    del entry.versions[v]
                entry.unavailable[v] = UNLOADED
                retired.append(old)
        entry.state = ModelState.READY
        entry.reason = ""
        log.info("successfully loaded '%s'", name, extra=model_event(name, ModelState.READY.value))
        previous_folder = tracked.override_folder if tracked is not None else None
        self.tracked[name] = _Tracked(
            md.path, fp, fp, explicit or (tracked is not None and tracked.explicit), override is not None, folder
        )
        self._retire_in_background(retired, previous_folder if previous_folder != folder else None)

    def _failed(self, name, entry, live, fp, md, explicit: bool) -> None:
        """Remember a failed attempt (poll mode retries only after the files change again)."""
        tracked = self.tracked.get(name)
        if tracked is None:
            self.tracked[name] = _Tracked(md.path, None, fp, explicit)
        else:
            tracked.attempted = fp
            tracked.explicit = tracked.explicit or explicit

    # ---- unloading ------------------------------------------------------------------

    async def _unload_now(self, name: str) -> None:
        """Refuse new requests to every version of `name` now; drain and stop them in the background."""
        async with self._lock(name):
            tracked = self.tracked.pop(name, None)
            entry = self.server.registry.entries.get(name)
            models = [m for m in entry.versions.values() if m.state is not ModelState.UNLOADING] if entry else []
            if not models:
                if entry is not None and entry.state is ModelState.UNAVAILABLE:
                    # It had failed to load: unloading it clears the failure (and its hold on readiness).
                    entry.reason = UNLOADED
                    entry.unavailable = dict.fromkeys(entry.unavailable, UNLOADED)
                if tracked is not None and tracked.override_folder is not None:
                    await asyncio.to_thread(remove_override_folder, tracked.override_folder)
                return
            entry.state = ModelState.UNLOADING
            for m in models:
                m.state = ModelState.UNLOADING
            folder = tracked.override_folder if tracked is not None else None
            self._retire_in_background(models, folder, entry)

    def _retire_in_background(self, models: list[Model], folder: Optional[Path] = None, entry=None) -> None:
        if not models and folder is None:
            return
        task = asyncio.ensure_future(self._retire(models, folder, entry))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _retire(self, models: list[Model], folder: Optional[Path], entry) -> None:
        try:
            if models:
                await self.server.retire_models(models)
        finally:
            if entry is not None:  # an unload: the versions are listed as unloaded from now on
                for m in models:
                    if entry.versions.get(m.version) is m:
                        del entry.versions[m.version]
                        entry.unavailable[m.version] = UNLOADED
                if not entry.versions and entry.state is ModelState.UNLOADING:  # no new load began meanwhile
                    entry.state = ModelState.UNAVAILABLE
                    entry.reason = UNLOADED
            if folder is not None:
                await asyncio.to_thread(remove_override_folder, folder)
        await self._changed()  # the versions' final state (unloaded): every front of several reads it too

    def _with_dependent_ensembles(self, names: list[str]) -> list[str]:
        """`names` and every loaded ensemble that uses one of them, directly or not."""
        targets = list(dict.fromkeys(names))
        changed = True
        while changed:
            changed = False
            for entry_name, steps in self._loaded_ensembles().items():
                if entry_name not in targets and steps & set(targets):
                    targets.append(entry_name)
                    changed = True
        return targets

    def _with_unneeded_steps(self, targets: list[str]) -> list[str]:
        """Add the steps of unloaded ensembles that were loaded only for them and nothing else needs."""
        targets = list(targets)
        ensembles = self._loaded_ensembles()
        changed = True
        while changed:
            changed = False
            for name in list(targets):
                for step in sorted(ensembles.get(name, ())):
                    tracked = self.tracked.get(step)
                    if step in targets or tracked is None or tracked.explicit:
                        continue
                    users = {e for e, steps in ensembles.items() if step in steps and e not in targets}
                    if not users:
                        targets.append(step)
                        changed = True
        return targets

    def _loaded_ensembles(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for name, entry in self.server.registry.entries.items():
            for m in entry.versions.values():
                if m.is_ensemble and m.state is not ModelState.UNLOADING:
                    out.setdefault(name, set()).update(s.model_name for s in m.config.ensemble_scheduling.step)
        return out


def _poll_failed(name: str, detail: str, code: ErrorCode = ErrorCode.INVALID_ARG, found: bool = True) -> KernelError:
    """Triton's answer when the model's folder cannot be used; the detail says why.

    Triton answers all of these 500; most are the client's mistake (an unknown model, a bad
    override), so they are INVALID_ARG (400) here and only the server's own trouble is INTERNAL.
    Its log says "failed to poll model" when no folder was found, "Poll failed for model
    directory" when one was and cannot be used (tritonserver 2.51's two lines).
    """
    if found:
        log.error("Poll failed for model directory '%s': %s", name, detail)
    else:
        log.error("failed to poll model '%s': %s", name, detail)
    return KernelError(code, f"failed to load '{name}', failed to poll from model repository: {detail}")


def _comparable(config: dict) -> dict:
    """A config as compared to decide on a reload: the version policy only picks versions."""
    return {k: v for k, v in config.items() if k != "version_policy"}
