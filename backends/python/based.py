"""Python-based backends: `<backend-directory>/<name>/model.py` serves every model whose
config says `backend: "<name>"`.

Such a backend is the Python backend with a different model file: the
backend's own model.py is always the one run (a model.py in the model's version
folder is ignored), while `initialize(args)` still sees the model's own name,
repository and version, and `pb_utils.get_model_dir()` the model's version
folder. It shares the Python backend's settings (`--backend-config python,...`),
as in Triton. When the backend folder holds `pb_exec_env_model.py.tar.gz` and
the model names no EXECUTION_ENV_PATH, the model runs in that environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from backends.python.backend import PythonBackend
from backends.python.execenv import PARAMETER as EXECUTION_ENV_PATH
from kernel.backend import Backend

MODEL_FILE = "model.py"


class PythonBasedBackend(PythonBackend):
    def __init__(self, base: PythonBackend, name: str, directory: Path):
        # Not PythonBackend.__init__: settings and the environment cache are the base's.
        self.name = name
        self.directory = directory
        self.settings = base.settings
        self.envs = base.envs
        self._restarting = set()

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


def discover(base: PythonBackend, name: str, backend_directory: Path) -> tuple[Optional[Backend], list[str]]:
    folder = Path(backend_directory) / name
    candidate = folder / MODEL_FILE
    if candidate.is_file():
        return PythonBasedBackend(base, name, Path(os.path.abspath(folder))), [str(candidate)]
    return None, [str(candidate)]
