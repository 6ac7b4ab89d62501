"""Importing a model's model.py inside a worker (and the auto-complete process)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_model_class(model_file: str):
    """Import model.py as a fresh module and return its TritonPythonModel class."""
    path = Path(model_file)
    if not path.is_file():
        raise FileNotFoundError(f"unable to find model file '{model_file}'")
    # Models import helper modules that sit next to model.py.
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    cls = getattr(module, "TritonPythonModel", None)
    if cls is None:
        raise AttributeError(f"'{model_file}' does not define class TritonPythonModel")
    return cls
