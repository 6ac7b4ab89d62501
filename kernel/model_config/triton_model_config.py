"""TritonModelConfig: the complete description of a bound model, from which config.pbtxt is generated.

This is what `get_model_config()` and `TritonContext.model_configs` hand to
decorators such as @fill_optionals.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Type, Union

import numpy as np

from kernel.model_config.common import DeviceKind, DynamicBatcher, ModelWarmup


@dataclasses.dataclass
class ResponseCache:
    enable: bool


@dataclasses.dataclass
class TensorSpec:
    """A named input or output: shape without the batch dimension, numpy scalar type."""

    name: str
    shape: tuple
    dtype: Union[Type[np.dtype], Type[object]]
    optional: Optional[bool] = False


@dataclasses.dataclass
class TritonModelConfig:
    model_name: str
    model_version: int = 1
    max_batch_size: int = 4
    batching: bool = True
    batcher: Optional[DynamicBatcher] = None
    instance_group: Dict[DeviceKind, Optional[int]] = dataclasses.field(default_factory=dict)
    decoupled: bool = False
    backend_parameters: Dict[str, str] = dataclasses.field(default_factory=dict)
    inputs: Optional[Sequence[TensorSpec]] = None
    outputs: Optional[Sequence[TensorSpec]] = None
    response_cache: Optional[ResponseCache] = None
    model_warmup: Optional[List[ModelWarmup]] = None

    @property
    def backend(self) -> str:
        return "python"
