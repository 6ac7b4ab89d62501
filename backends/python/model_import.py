"""Importing a model's model.py inside a worker (and the auto-complete process).

As Triton's stub does: the folder holding model.py (the version folder) is a
package named after it, so model.py is module "<version>.model" and may
import its neighbours relatively (`from .helpers import f`); the version
folder and the model folder go at the end of sys.path, so `import helpers`
and `import <module next to config.pbtxt>` work too, without shadowing the
interpreter's own modules.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path


def load_model_class(model_file: str):
    """Import model.py as a fresh module and return its TritonPythonModel class."""
    path = Path(model_file).absolute()
    if not path.is_file():
        raise FileNotFoundError(f"unable to find model file '{model_file}'")
    version_dir = path.parent
    for entry in (str(version_dir), str(version_dir.parent)):
        if entry not in sys.path:
            sys.path.append(entry)
    if "" not in sys.path:
        # An embedded interpreter's first entry (the current directory), as the model sees under
        # Triton; the worker dropped it at start so that nothing there shadows Kernel's own modules.
        sys.path.insert(0, "")
    package = _folder_package(version_dir)
    name = f"{package.__name__}.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    setattr(package, path.stem, module)  # as an import statement would
    cls = getattr(module, "TritonPythonModel", None)
    if cls is None:
        raise AttributeError(f"'{model_file}' does not define class TritonPythonModel")
    return cls


def _folder_package(folder: Path):
    """Register `folder` as a namespace package named after it (Triton's module names: "1.model").

    Its search path is that folder alone, so a folder of the same name elsewhere on
    sys.path (the current directory, say) cannot shadow the model's own files.
    """
    name = folder.name
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    return package
