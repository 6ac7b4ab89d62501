"""The model repository on disk: model folders, version folders, config files.

    <repository>/<model>/config.pbtxt          optional when auto-complete is on
    <repository>/<model>/configs/<name>.pbtxt  chosen by --model-config-name
    <repository>/<model>/<version>/model.py    version = a non-negative integer

These functions do blocking file I/O; the server calls them while loading
models, never on the request path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kernel.core.errors import ErrorCode, KernelError
from kernel.config.pbtxt import ModelConfig, parse_config_text

log = logging.getLogger("kernel.loading.repository")

CONFIG_FILENAME = "config.pbtxt"
CUSTOM_CONFIG_FOLDER = "configs"
# Folders inside a model folder that Triton never treats as versions.
_RESERVED_FOLDERS = frozenset({"warmup", "initial_state", CUSTOM_CONFIG_FOLDER})


@dataclass
class ModelDir:
    name: str
    path: Path
    config_path: Path | None  # None: no config file, the config is auto-completed
    versions: dict[int, Path] = field(default_factory=dict)


def parse_version(folder_name: str) -> int | None:
    """Version number of a version folder name, or None if it is not one.

    Like Triton: digits only, and no leading zeros ("0" itself is version 0).
    """
    if not folder_name.isascii() or not folder_name.isdigit():
        return None
    if len(folder_name) > 1 and folder_name.startswith("0"):
        return None
    return int(folder_name)


def scan_model_dir(path: Path, config_name: str | None = None) -> ModelDir:
    """Describe one model folder."""
    versions: dict[int, Path] = {}
    for child in sorted(path.iterdir()):
        if not child.is_dir() or child.name.startswith(".") or child.name in _RESERVED_FOLDERS:
            continue
        version = parse_version(child.name)
        if version is None:
            if child.name.isdigit():
                log.warning("ignore version directory '%s' which contains leading zeros in its directory name", child.name)
            else:
                log.warning("ignore version directory '%s' which fails to convert to integral number", child.name)
            continue
        versions[version] = child
    return ModelDir(name=path.name, path=path, config_path=_config_path(path, config_name), versions=versions)


def _config_path(path: Path, config_name: str | None) -> Path | None:
    if config_name:
        custom = path / CUSTOM_CONFIG_FOLDER / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    default = path / CONFIG_FILENAME
    return default if default.is_file() else None


def scan_repository(root: Path, config_name: str | None = None) -> list[ModelDir]:
    """Every non-hidden sub-folder of `root` is a model, sorted by name.

    `config_name` is --model-config-name: <model>/configs/<config_name>.pbtxt
    is used instead of config.pbtxt when it exists.
    """
    root = Path(root)
    if not root.is_dir():
        raise KernelError(ErrorCode.INVALID_ARG, f"failed to stat file {root}")
    models = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.name.startswith("."):
            models.append(scan_model_dir(child, config_name))
    return models


def load_model_config(model: ModelDir) -> ModelConfig:
    """Parse the model's config file; an empty config when it has none (auto-complete fills it)."""
    if model.config_path is None:
        return ModelConfig()
    try:
        text = model.config_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KernelError(ErrorCode.INVALID_ARG, f"failed to read text proto from {model.config_path}: {exc}") from None
    return parse_config_text(text, str(model.config_path))


def select_versions(cfg: ModelConfig, available: list[int]) -> list[int]:
    """The versions to load under cfg.version_policy, ascending.

    latest{n}: the n highest; all: every one; specific: the listed ones that
    exist. As in Triton, a listed version without a folder is logged and
    skipped; only ending up with no version at all is an error.
    """
    present = sorted(set(available), reverse=True)
    policy = cfg.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "specific":
        chosen = []
        for version in policy.specific.versions:
            if version in present:
                chosen.append(version)
            else:
                log.error(
                    "version %d is specified for model '%s', but the version directory is not present",
                    version,
                    cfg.name,
                )
    elif choice == "all":
        chosen = present
    else:
        # latest; an unset policy means latest{1} (normalize_config sets it).
        wanted = policy.latest.num_versions if choice == "latest" else 1
        chosen = present[:wanted]
    if not chosen:
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"at least one version must be available under the version policy of model '{cfg.name}'",
        )
    return sorted(set(chosen))


# ---- the repositories on disk (blocking: model control runs these in a thread) ----------------


def scan_repositories(roots, config_name: Optional[str] = None) -> tuple[dict[str, ModelDir], dict[str, list[Path]]]:
    """Every model folder of every repository; names found in several repositories apart."""
    found: dict[str, list[ModelDir]] = {}
    for root in roots:
        for md in scan_repository(Path(root), config_name):
            found.setdefault(md.name, []).append(md)
    dirs = {n: mds[0] for n, mds in found.items() if len(mds) == 1}
    duplicates = {n: [md.path.parent for md in mds] for n, mds in found.items() if len(mds) > 1}
    return dirs, duplicates


def folder_names(roots) -> tuple[set[str], set[str]]:
    """Model folder names found in exactly one repository, and those found in several."""
    seen: dict[str, int] = {}
    for root in roots:
        try:
            children = sorted(Path(root).iterdir())
        except OSError as exc:
            raise KernelError(ErrorCode.INTERNAL, f"failed to read model repository '{root}': {exc}") from None
        for child in children:
            if child.is_dir() and not child.name.startswith("."):
                seen[child.name] = seen.get(child.name, 0) + 1
    return {n for n, c in seen.items() if c == 1}, {n for n, c in seen.items() if c > 1}


def folders_named(roots, name: str) -> list[Path]:
    """The repositories holding a model folder called `name`."""
    return [Path(root) for root in roots if (Path(root) / name).is_dir()]


def read_config_or_none(md: ModelDir):
    try:
        return load_model_config(md)
    except KernelError:
        return None  # the load itself reports it


def config_or_parse_error(md: ModelDir):
    """(config, None); (None, reason) when the config file is not valid text protobuf; (None, None)
    for any other problem, which the load itself reports."""
    try:
        return load_model_config(md), None
    except KernelError as exc:
        if exc.message.startswith("failed to read text proto"):
            return None, exc.message
        return None, None


def with_steps(names: set[str], dirs: dict[str, ModelDir]) -> set[str]:
    """`names` and, for ensembles, the models their steps use (as tritonserver loads them), found in `dirs`."""
    out = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in out or name not in dirs:
            continue
        out.add(name)
        cfg = read_config_or_none(dirs[name])
        if cfg is not None and cfg.HasField("ensemble_scheduling"):
            todo.extend(s.model_name for s in cfg.ensemble_scheduling.step)
    return out

