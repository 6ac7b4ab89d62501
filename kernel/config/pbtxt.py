"""config.pbtxt: the stages a model's configuration goes through, as in tritonserver.

    parse_config_text / load_model_config      (text format, or empty if absent)   kernel.config.text
    normalize_config                           (server-side defaults)              kernel.config.complete
    [backend auto-complete -> config_from_dict / apply_autocomplete, normalize again]
    validate_config                            (reject broken configurations)      kernel.config.validate
    config_to_dict / config_to_json            (GET .../config, initialize(args))  kernel.config.text

This module is the package's public face: callers import the stages from here and need not know
which module holds each.
"""

from __future__ import annotations

from kernel.config.complete import (
    apply_autocomplete,
    apply_default_max_batch_size,
    folder_name_mismatch,
    normalize_config,
)
from kernel.config.constants import (
    ENSEMBLE_PLATFORM,
    PYTHON_BACKEND,
    PYTHON_FILENAME,
    SEQUENCE_IDLE_DEFAULT_US,
    WILDCARD_DIM,
)
from kernel.config.text import config_from_dict, config_from_json, config_to_dict, config_to_json, parse_config_text
from kernel.config.validate import validate_config
from kernel.core.scheduling.controls import sequence_control
from kernel.protos.model_config_pb2 import DataType, ModelConfig

__all__ = [
    "DataType",
    "ModelConfig",
    "parse_config_text",
    "config_to_dict",
    "config_to_json",
    "config_from_dict",
    "config_from_json",
    "normalize_config",
    "folder_name_mismatch",
    "apply_default_max_batch_size",
    "apply_autocomplete",
    "validate_config",
    "sequence_control",
    "PYTHON_BACKEND",
    "PYTHON_FILENAME",
    "ENSEMBLE_PLATFORM",
    "SEQUENCE_IDLE_DEFAULT_US",
    "WILDCARD_DIM",
]
