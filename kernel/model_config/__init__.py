"""PyTriton-compatible model configuration (`pytriton.model_config` -> `kernel.model_config`)."""

from kernel.model_config.common import (
    DeviceKind,
    DynamicBatcher,
    ModelWarmup,
    QueuePolicy,
    TimeoutAction,
    WarmupInput,
)
from kernel.model_config.model_config import ModelConfig
from kernel.model_config.tensor import Tensor

__all__ = [
    "DeviceKind", "DynamicBatcher", "ModelConfig", "ModelWarmup", "QueuePolicy", "Tensor", "TimeoutAction",
    "WarmupInput",
]
