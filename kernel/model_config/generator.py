"""config.pbtxt for a bound model, from its TritonModelConfig (`pytriton.model_config.generator`).

`ModelConfigGenerator(config).get_config()` gives the model configuration as
protobuf-JSON data (what Triton's load API takes); `to_file(path)` writes it as
config.pbtxt text. Invalid batching settings raise PyTritonBadParameterError.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any, Dict, Union

import numpy as np
from google.protobuf import json_format, text_format

from kernel.core import datatypes
from kernel.exceptions import PyTritonBadParameterError
from kernel.model_config.common import DynamicBatcher, QueuePolicy
from kernel.model_config.triton_model_config import TensorSpec, TritonModelConfig

LOGGER = logging.getLogger(__name__)


def config_type_of(dtype: Any) -> str:
    """The config.pbtxt data type for a numpy dtype (`bytes`/`object` -> TYPE_STRING)."""
    try:
        datatype = datatypes.numpy_to_datatype(np.dtype(dtype))
    except TypeError:
        datatype = None
    if datatype is None:
        raise PyTritonBadParameterError(f"Unsupported data type {dtype!r}: it has no Triton equivalent.")
    return datatypes.datatype_to_config_type(datatype)


class ModelConfigGenerator:
    """Turns a TritonModelConfig into Triton's model configuration."""

    def __init__(self, config: TritonModelConfig):
        self._config = config

    def get_config(self) -> Dict[str, Any]:
        c = self._config
        out: Dict[str, Any] = {"name": c.model_name, "backend": c.backend}
        self._batching(out)
        self._signature(out)
        if c.instance_group:
            out["instance_group"] = [
                {"count": count, "kind": kind.value} for kind, count in c.instance_group.items()
            ]
        if c.decoupled:
            out["model_transaction_policy"] = {"decoupled": True}
        if c.backend_parameters:
            out["parameters"] = {k: {"string_value": str(v)} for k, v in c.backend_parameters.items()}
        if c.response_cache:
            out["response_cache"] = {"enable": c.response_cache.enable}
        if c.model_warmup:
            out["model_warmup"] = [self._warmup(w) for w in c.model_warmup]
        return out

    def to_file(self, config_path: Union[str, pathlib.Path]):
        """Write config.pbtxt; returns the configuration as a protobuf message."""
        from kernel.protos.model_config_pb2 import ModelConfig

        data = self.get_config()
        message = json_format.ParseDict(data, ModelConfig())
        text = text_format.MessageToString(message)
        if data.get("max_batch_size") == 0:
            # Text format leaves zero values out; say it so batching is explicitly off.
            text += "max_batch_size: 0\n"
        path = pathlib.Path(config_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        LOGGER.debug("Wrote model configuration to %s", path)
        return message

    # ---- parts -----------------------------------------------------------------------------

    def _batching(self, out: Dict[str, Any]) -> None:
        c = self._config
        if not c.batching:
            out["max_batch_size"] = 0
            return
        if c.max_batch_size < 1:
            raise PyTritonBadParameterError("The `max_batch_size` must be greater or equal to 1.")
        out["max_batch_size"] = c.max_batch_size
        batcher = c.batcher
        if not isinstance(batcher, DynamicBatcher):
            return
        db: Dict[str, Any] = {}
        if batcher.max_queue_delay_microseconds > 0:
            db["max_queue_delay_microseconds"] = int(batcher.max_queue_delay_microseconds)
        if batcher.preferred_batch_size:
            db["preferred_batch_size"] = [int(size) for size in batcher.preferred_batch_size]
        if batcher.preserve_ordering:
            db["preserve_ordering"] = True
        if batcher.priority_levels:
            db["priority_levels"] = int(batcher.priority_levels)
        if batcher.default_priority_level:
            if batcher.default_priority_level > batcher.priority_levels:
                raise PyTritonBadParameterError(
                    f"The `default_priority_level` must be between 1 and {batcher.priority_levels}."
                )
            db["default_priority_level"] = int(batcher.default_priority_level)
        if batcher.default_queue_policy:
            db["default_queue_policy"] = _queue_policy(batcher.default_queue_policy)
        if batcher.priority_queue_policy:
            if not batcher.priority_levels:
                raise PyTritonBadParameterError(
                    "Set `priority_levels` to define a `priority_queue_policy` for the dynamic batcher."
                )
            policies = {}
            for level, policy in batcher.priority_queue_policy.items():
                if level < 0 or level > batcher.priority_levels:
                    raise PyTritonBadParameterError(
                        f"Invalid `priority`={level}: it must be between 1 and {batcher.priority_levels}."
                    )
                policies[str(level)] = _queue_policy(policy)
            db["priority_queue_policy"] = policies
        out["dynamic_batching"] = db

    def _signature(self, out: Dict[str, Any]) -> None:
        c = self._config
        if c.inputs:
            out["input"] = [_tensor(spec) for spec in c.inputs]
        if c.outputs:
            outputs = [_tensor(spec) for spec in c.outputs]
            optional = [o["name"] for o in outputs if o.get("optional")]
            if optional:
                raise PyTritonBadParameterError(
                    "Outputs cannot be optional; marked optional: " + ", ".join(optional) + "."
                )
            out["output"] = outputs

    @staticmethod
    def _warmup(warmup) -> Dict[str, Any]:
        inputs = {}
        for name, spec in warmup.inputs.items():
            if not (spec.zero_data or spec.random_data or spec.input_data_file):
                raise PyTritonBadParameterError(
                    f"Warmup input `{name}` needs one of `zero_data`, `random_data` or `input_data_file`."
                )
            if not list(spec.shape):
                raise PyTritonBadParameterError(f"Warmup input `{name}` has no dimensions.")
            item: Dict[str, Any] = {"data_type": config_type_of(spec.dtype), "dims": [int(d) for d in spec.shape]}
            if spec.zero_data:
                item["zero_data"] = True
            elif spec.random_data:
                item["random_data"] = True
            else:
                item["input_data_file"] = spec.input_data_file
            inputs[name] = item
        return {"name": warmup.name, "batch_size": warmup.batch_size, "inputs": inputs, "count": warmup.count}


def _tensor(spec: TensorSpec) -> Dict[str, Any]:
    item: Dict[str, Any] = {"name": spec.name, "data_type": config_type_of(spec.dtype),
                            "dims": [int(d) for d in spec.shape]}
    if spec.optional:
        item["optional"] = True
    return item


def _queue_policy(policy: QueuePolicy) -> Dict[str, Any]:
    return {
        "timeout_action": policy.timeout_action.value,
        "default_timeout_microseconds": int(policy.default_timeout_microseconds),
        "allow_timeout_override": bool(policy.allow_timeout_override),
        "max_queue_size": int(policy.max_queue_size),
    }
