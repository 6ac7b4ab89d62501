"""Custom execution environments: the interpreter a model's workers run in.

A model picks one with the `EXECUTION_ENV_PATH` parameter of its config: a
conda-pack tarball or an unpacked environment directory (conda-pack layout or
a virtualenv: `bin/activate`, `bin/python3`, `lib/pythonX.Y/site-packages`).
`$$TRITON_MODEL_DIRECTORY` in the value stands for the model's folder, and the
resulting path must stay inside that folder. Remote paths (s3://, gs://, as://)
are refused.

The worker then runs on the environment's own interpreter, which may be a
different Python version than the server's: the worker is pure Python, so
nothing has to be rebuilt. What the worker sees (see envboot.py):

* the environment's packages, and not the server's (no user site either);
* Kernel's own pure-Python packages;
* numpy and msgspec (and uvloop, optional) from the environment when it has
  them. When it lacks them and its Python has the server's exact ABI (same
  SOABI), the server's copies of just those packages are lent; otherwise the
  load fails, saying what to install;
* the server's site-packages too (after the environment's) only when the model
  sets `KERNEL_INHERIT_SERVER_PACKAGES` to "yes"/"true" (same ABI required).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import re
import site
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kernel.backends.python.standby import BOOT
from kernel.core.backend import ModelSource
from kernel.core.errors import ErrorCode, KernelError

log = logging.getLogger("kernel.python")

PARAMETER = "EXECUTION_ENV_PATH"
INHERIT_PARAMETER = "KERNEL_INHERIT_SERVER_PACKAGES"
MODEL_DIR_VARIABLE = "$$TRITON_MODEL_DIRECTORY"
MIN_PYTHON = (3, 10)

_ENVBOOT = str(Path(__file__).resolve().with_name("envboot.py"))
# What a worker imports of Kernel's own, each found in the folder that holds it. Installed, the
# backends sit inside the kernel package; in a source checkout kernel.backends is the top-level
# backends/ folder (see pyproject's package-dir), so the folders are read from the packages themselves.
_OWN_PACKAGES = ("kernel", "kernel.backends", "triton_python_backend_utils")

# The boot string (`python -c`, the current directory dropped from sys.path) lives in standby.py,
# which the front imports before anything else.
_BOOT = BOOT


def _own_package_folders() -> dict[str, str]:
    folders = {}
    for name in _OWN_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        folders[name] = str(Path(list(spec.submodule_search_locations)[0]).resolve().parent)
    return folders
_REQUIRED = ("numpy", "msgspec")
_OPTIONAL = ("uvloop",)
_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_PROBE_TIMEOUT = 60.0

# Runs in the environment's interpreter (any version: it must at least report it).
_PROBE = r"""
import importlib.util, json, sys, sysconfig
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = importlib.util.find_spec(name) is not None
    except Exception:
        found[name] = False
print(json.dumps({
    "version": list(sys.version_info[:3]),
    "implementation": sys.implementation.name,
    "soabi": sysconfig.get_config_var("SOABI") or "",
    "found": found,
}))
"""


@dataclass(frozen=True)
class WorkerCommand:
    """How to start a Python module for a model: interpreter, bootstrap, environment variables."""

    argv: tuple[str, ...]
    env: dict = field(default_factory=dict)
    boot: bool = False  # argv ends with envboot.py, which takes the module name itself
    description: str = ""

    def module(self, name: str, *args: str) -> tuple[list[str], dict[str, str]]:
        if self.boot:
            return [*self.argv, name, *args], dict(self.env)
        return [*self.argv, "-c", _BOOT, name, *args], dict(self.env)


def server_command() -> WorkerCommand:
    """The default: the server's own interpreter, with Kernel's packages on its path."""
    return WorkerCommand((sys.executable,), dict(os.environ))


@dataclass(frozen=True)
class _Probe:
    version: tuple[int, ...]
    implementation: str
    soabi: str
    found: dict


def _parameter(config, key: str) -> Optional[str]:
    if key in config.parameters:
        return config.parameters[key].string_value
    return None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve_path(value: str, model_name: str, model_dir: Path) -> Path:
    """EXECUTION_ENV_PATH as a local absolute path; KernelError when it cannot be one."""
    text = value.strip()
    if not text:
        raise KernelError(ErrorCode.INVALID_ARG, f"{PARAMETER} of model '{model_name}' is empty")
    if _REMOTE.match(text):
        raise KernelError(
            ErrorCode.UNSUPPORTED,
            f"{PARAMETER} '{text}' of model '{model_name}': execution environments on remote storage "
            "(s3://, gs://, as://, ...) are not supported by Kernel; put the environment on a local path "
            f"or inside the model directory and use {MODEL_DIR_VARIABLE}",
        )
    relative_to_model = MODEL_DIR_VARIABLE in text
    if relative_to_model:
        text = text.replace(MODEL_DIR_VARIABLE, str(model_dir))
    path = os.path.abspath(text)
    if relative_to_model:
        root = os.path.abspath(model_dir)
        if not _inside(path, root) or not _inside(os.path.realpath(path), os.path.realpath(root)):
            raise KernelError(
                ErrorCode.INVALID_ARG,
                f"{PARAMETER} '{value}' of model '{model_name}' resolves to '{os.path.realpath(path)}', "
                f"outside the model directory '{root}': a path using {MODEL_DIR_VARIABLE} must stay inside it",
            )
    return Path(path)


def _interpreter(env_dir: Path) -> Optional[Path]:
    for name in ("python3", "python"):
        candidate = env_dir / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _truthy(value: str, model_name: str) -> bool:
    v = value.strip().lower()
    if v in ("yes", "true", "1", "on"):
        return True
    if v in ("no", "false", "0", "off", ""):
        return False
    raise KernelError(
        ErrorCode.INVALID_ARG,
        f"invalid value '{value}' for parameter {INHERIT_PARAMETER} of model '{model_name}' (expected yes or no)",
    )


def _mtime(path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _server_abi() -> tuple[str, str]:
    return sys.implementation.name, sysconfig.get_config_var("SOABI") or ""


def _server_location(name: str) -> Optional[str]:
    """The directory the server imports top-level package `name` from."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return str(Path(list(spec.submodule_search_locations)[0]).parent)
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return str(Path(spec.origin).parent)
    return None


def _server_site_dirs() -> list[str]:
    dirs = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    dirs += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    out = []
    for d in dirs:
        d = os.path.abspath(d)
        if d not in out and os.path.isdir(d):
            out.append(d)
    return out


class ExecutionEnvironments:
    """Resolves, unpacks (once) and inspects the execution environments models name."""

    def __init__(self, cache_dir: Optional[Path] = None):
        # The archive code (tarfile, hashlib, ...) is imported by the first model that names an
        # environment, not by every server's start-up.
        self._cache_dir = Path(os.path.abspath(cache_dir)) if cache_dir else None
        self._unpacking: dict[tuple, asyncio.Future] = {}
        self._probes: dict[tuple, asyncio.Future] = {}
        self._announced: set[tuple[str, str]] = set()

    @property
    def cache_dir(self) -> Path:
        if self._cache_dir is None:
            from kernel.backends.python.envarchive import default_cache_dir

            self._cache_dir = Path(os.path.abspath(default_cache_dir()))
        return self._cache_dir

    async def command_for(self, source: ModelSource) -> WorkerCommand:
        value = _parameter(source.config, PARAMETER)
        if value is None:
            return server_command()
        from kernel.backends.python.envboot import SPEC_VARIABLE

        name = source.name
        path = resolve_path(value, name, source.model_dir)
        env_dir = await self._environment_dir(path, name)
        if not (env_dir / "bin" / "activate").is_file():
            raise KernelError(
                ErrorCode.INTERNAL,
                f"execution environment '{env_dir}' of model '{name}' has no bin/activate script: expected a "
                "conda-pack or virtualenv layout (bin/activate, bin/python3, lib/pythonX.Y/site-packages)",
            )
        interpreter = _interpreter(env_dir)
        if interpreter is None:
            raise KernelError(
                ErrorCode.INTERNAL,
                f"execution environment '{env_dir}' of model '{name}' has no Python interpreter "
                "(looked for bin/python3 and bin/python)",
            )
        env = self._environment_variables(env_dir)
        probe = await self._probe(interpreter, env, name)
        inherit = _truthy(_parameter(source.config, INHERIT_PARAMETER) or "", name)
        spec = self._import_spec(env_dir, interpreter, probe, inherit, name)
        env[SPEC_VARIABLE] = json.dumps(spec)
        version = ".".join(map(str, probe.version))
        lent = ", ".join(sorted(spec["lent"])) or "nothing"
        if (name, str(env_dir)) not in self._announced:
            self._announced.add((name, str(env_dir)))
            log.info("Using Python execution env %s (Python %s) for model '%s'", env_dir, version, name)
        log.debug("execution env %s: lent from the server: %s; inherit server packages: %s", env_dir, lent, inherit)
        return WorkerCommand((str(interpreter), "-s", _ENVBOOT), env, boot=True, description=str(env_dir))

    # ---- the environment's directory ----------------------------------------

    async def _environment_dir(self, path: Path, model_name: str) -> Path:
        if not path.exists():
            raise KernelError(
                ErrorCode.INVALID_ARG, f"{PARAMETER} '{path}' of model '{model_name}' does not exist"
            )
        if path.is_dir():
            return Path(os.path.realpath(path))
        real = Path(os.path.realpath(path))
        st = real.stat()
        key = (str(real), st.st_size, st.st_mtime_ns)
        fut = self._unpacking.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._unpack(real))
            self._unpacking[key] = fut
        try:
            return await asyncio.shield(fut)
        except KernelError as exc:
            raise KernelError(exc.code, f"model '{model_name}': {exc.message}") from None

    async def _unpack(self, archive: Path) -> Path:
        import tarfile
        import zlib

        from kernel.backends.python import envarchive

        def work() -> tuple[Path, bool]:
            if not tarfile.is_tarfile(archive):
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"{PARAMETER} '{archive}' is neither a directory nor a tar archive (conda-pack .tar.gz)",
                )
            return envarchive.unpack_cached(archive, self.cache_dir)

        try:
            env_dir, unpacked = await asyncio.to_thread(work)
        except KernelError:
            raise
        except envarchive.UnsafeArchive as exc:
            raise KernelError(
                ErrorCode.INVALID_ARG, f"refusing to unpack execution environment '{archive}': {exc}"
            ) from None
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise KernelError(
                ErrorCode.INTERNAL, f"failed to unpack execution environment '{archive}': {exc}"
            ) from None
        if unpacked:
            log.info("Extracted Python execution env %s into %s", archive, env_dir)
        else:
            log.info("Reusing Python execution env %s, already extracted in %s", archive, env_dir)
        return env_dir

    # ---- the environment's interpreter --------------------------------------

    @staticmethod
    def _environment_variables(env_dir: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONEXECUTABLE")}
        env["VIRTUAL_ENV"] = str(env_dir)
        env["PATH"] = os.pathsep.join(p for p in (str(env_dir / "bin"), env.get("PATH", "")) if p)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(env_dir / "lib"), env.get("LD_LIBRARY_PATH", "")) if p
        )
        env["PYTHONNOUSERSITE"] = "1"
        return env

    async def _probe(self, interpreter: Path, env: dict[str, str], model_name: str) -> _Probe:
        # Probed again when the interpreter or the environment's site-packages change.
        real = os.path.realpath(interpreter)
        sites = sorted(interpreter.parent.parent.glob("lib/python*/site-packages"))
        key = (real, _mtime(real), *((str(p), _mtime(p)) for p in sites))
        fut = self._probes.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._run_probe(interpreter, env))
            self._probes[key] = fut
        try:
            return await asyncio.shield(fut)
        except KernelError as exc:
            raise KernelError(exc.code, f"model '{model_name}': {exc.message}") from None

    @staticmethod
    async def _run_probe(interpreter: Path, env: dict[str, str]) -> _Probe:
        try:
            proc = await asyncio.create_subprocess_exec(
                str(interpreter), "-s", "-E", "-c", _PROBE, *_REQUIRED, *_OPTIONAL,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            out, err = await asyncio.wait_for(proc.communicate(), _PROBE_TIMEOUT)
        except asyncio.TimeoutError:
            proc.kill()
            raise KernelError(ErrorCode.INTERNAL, f"'{interpreter}' did not answer within {_PROBE_TIMEOUT:g} s") from None
        except OSError as exc:
            raise KernelError(ErrorCode.INTERNAL, f"cannot run the execution environment's Python '{interpreter}': {exc}") from None
        try:
            info = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
            probe = _Probe(tuple(info["version"]), info["implementation"], info["soabi"], info["found"])
        except (ValueError, IndexError, KeyError, TypeError):
            detail = err.decode(errors="replace").strip()[-2000:] or f"exit code {proc.returncode}"
            raise KernelError(
                ErrorCode.INTERNAL, f"cannot run the execution environment's Python '{interpreter}': {detail}"
            ) from None
        if probe.implementation != "cpython" or probe.version[:2] < MIN_PYTHON:
            found = f"{probe.implementation} {'.'.join(map(str, probe.version))}"
            raise KernelError(
                ErrorCode.INTERNAL,
                f"execution environment Python '{interpreter}' is {found}; Kernel's worker needs CPython "
                f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer",
            )
        return probe

    @staticmethod
    def _import_spec(env_dir: Path, interpreter: Path, probe: _Probe, inherit: bool, model_name: str) -> dict:
        same_abi = bool(probe.soabi) and (probe.implementation, probe.soabi) == _server_abi()
        version = ".".join(map(str, probe.version))
        server_version = ".".join(map(str, sys.version_info[:3]))
        lent: dict[str, str] = {}
        missing = []
        for name in (*_REQUIRED, *_OPTIONAL):
            if probe.found.get(name):
                continue
            where = _server_location(name) if same_abi else None
            if where is not None:
                lent[name] = where
            elif name in _REQUIRED:
                missing.append(name)
        if missing:
            reason = (
                f"its Python ({version}, {probe.soabi}) is not the server's ({server_version}, {_server_abi()[1]}), "
                "so the server's copies cannot be lent"
                if not same_abi
                else "and the server has no copy to lend"
            )
            raise KernelError(
                ErrorCode.INTERNAL,
                f"execution environment '{env_dir}' of model '{model_name}' lacks {', '.join(missing)}, which "
                f"Kernel's worker needs, and {reason}: install them with "
                f"'{interpreter} -m pip install {' '.join(missing)}'",
            )
        extra_path: list[str] = []
        if inherit:
            if not same_abi:
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"model '{model_name}' sets {INHERIT_PARAMETER}, but its execution environment runs Python "
                    f"{version} ({probe.soabi}) and the server Python {server_version} ({_server_abi()[1]}): "
                    "the server's packages can only be shared with the same Python",
                )
            extra_path = _server_site_dirs()
        return {"own": _own_package_folders(), "lent": lent, "extra_path": extra_path}
