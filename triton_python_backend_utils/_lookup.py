"""Helpers that find a tensor or a tensor's config entry by name, and the
model's own directory."""

from __future__ import annotations

from . import _hooks as hooks
from ._errors import TritonModelException


def get_input_tensor_by_name(inference_request, name):
    """The request's input Tensor called ``name``, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response, name):
    """The response's output Tensor called ``name``, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config, name):
    """The ``input`` entry of a model-config dict called ``name``, or None."""
    for entry in model_config.get("input", ()):
        if entry["name"] == name:
            return entry
    return None


def get_output_config_by_name(model_config, name):
    """The ``output`` entry of a model-config dict called ``name``, or None."""
    for entry in model_config.get("output", ()):
        if entry["name"] == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config):
    """True when the model-config dict sets a decoupled transaction policy."""
    policy = model_config.get("model_transaction_policy")
    if policy:
        return bool(policy.get("decoupled", False))
    return False


def get_model_dir():
    """Directory holding the model's ``model.py`` (the version directory)."""
    model_dir = hooks.package()._model_dir
    if model_dir is None:
        raise TritonModelException(
            "get_model_dir() is only available once the model is being loaded"
        )
    return model_dir


def set_model_dir(path):
    """Worker hook (``pb_utils._set_model_dir``): record the directory
    get_model_dir() returns; kept on the package as ``_model_dir``."""
    hooks.package()._model_dir = None if path is None else str(path)
