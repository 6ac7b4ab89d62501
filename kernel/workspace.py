"""The folder a Triton() object keeps its files in (the generated model store among them).

Without a path, a fresh folder is made under $PYTRITON_HOME (default
~/.cache/kernel) and removed again by clean(); a given path must not exist yet,
as with PyTriton, so a workspace never deletes someone else's files.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import tempfile
import warnings
from typing import Optional, Union

LOGGER = logging.getLogger(__name__)


class CleanupWarning(UserWarning):
    """The workspace could not be removed completely."""


def _home() -> pathlib.Path:
    default = os.path.join(os.getenv("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "kernel")
    return pathlib.Path(os.path.expanduser(os.path.expandvars(os.getenv("PYTRITON_HOME", default)))).resolve()


class Workspace:
    def __init__(self, workspace_path: Optional[Union[str, pathlib.Path]] = None):
        if workspace_path is None:
            home = _home()
            home.mkdir(parents=True, exist_ok=True)
            self._path = pathlib.Path(tempfile.mkdtemp(prefix="workspace_", dir=home)).resolve()
        else:
            self._path = pathlib.Path(workspace_path).resolve()
            self._path.mkdir(parents=True)  # FileExistsError for an existing folder, as PyTriton
        self.model_store_path = self._path / "model-store"
        self.model_store_path.mkdir(parents=True, exist_ok=True)
        LOGGER.debug("Workspace path %s", self._path)

    @property
    def path(self) -> pathlib.Path:
        return self._path

    def exists(self) -> bool:
        return self._path.exists()

    def is_empty(self) -> bool:
        return not any(not p.name.startswith(".") for p in self._path.iterdir()) if self.exists() else True

    def clean(self) -> None:
        """Remove the workspace and everything in it (hidden entries at its top are left alone)."""
        if not self.exists():
            return
        try:
            for child in self._path.iterdir():
                if child.name.startswith("."):
                    continue
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            if not any(self._path.iterdir()):
                self._path.rmdir()
        except OSError as exc:
            warnings.warn(f"Could not clean workspace {self._path}: {exc}", CleanupWarning, stacklevel=2)
