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
