"""load_model / unload_model / is_model_ready for model code, served by the
worker's BLS handler."""

from __future__ import annotations

from . import _hooks as hooks
from ._errors import TritonModelException


def _model_control(method):
    handler = hooks.bls_handler()
    function = getattr(handler, method, None)
    if function is None:
        raise TritonModelException(
            "The model loading API is not available in this process"
        )
    return function


def load_model(model_name, config="", files=None):
    """Load (or reload) ``model_name``; ``config`` is an optional JSON model
    config override and ``files`` maps "file:<path>" to bytes content."""
    if not isinstance(model_name, str) or not isinstance(config, str):
        raise TypeError("model_name and config must be str")
    return _model_control("load_model")(model_name, config, files)


def unload_model(model_name, unload_dependents=False):
    if not isinstance(model_name, str):
        raise TypeError("model_name must be a str")
    return _model_control("unload_model")(model_name, bool(unload_dependents))


def is_model_ready(model_name, model_version=""):
    if not isinstance(model_name, str) or not isinstance(model_version, str):
        raise TypeError("model_name and model_version must be str")
    return bool(_model_control("is_model_ready")(model_name, model_version))
