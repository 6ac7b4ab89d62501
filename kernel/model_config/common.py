"""Configuration types shared by the public ModelConfig and the internal TritonModelConfig.

Names, fields and defaults follow PyTriton's `pytriton.model_config` so programs
written for it keep working after swapping the import prefix.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Dict, Optional, Sequence, Type, Union

import numpy as np


class DeviceKind(enum.Enum):
    """Where a model instance runs (instance_group.kind)."""

    KIND_AUTO = "KIND_AUTO"
    KIND_CPU = "KIND_CPU"
    KIND_GPU = "KIND_GPU"


class TimeoutAction(enum.Enum):
    """What the dynamic batcher does with a request whose queue timeout expired."""

    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclasses.dataclass
class QueuePolicy:
    """The dynamic batcher's queue policy (model_config.proto ModelQueuePolicy)."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclasses.dataclass
class DynamicBatcher:
    """The dynamic batcher's settings (model_config.proto ModelDynamicBatching)."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: Optional[list] = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: Optional[QueuePolicy] = None
    priority_queue_policy: Optional[Dict[int, QueuePolicy]] = None


@dataclasses.dataclass
class WarmupInput:
    """One input of a warm-up request: zeros, random data, or a .npy file."""

    dtype: Union[Type[np.dtype], Type[object]]
    shape: Sequence[int]
    zero_data: Optional[bool] = False
    random_data: Optional[bool] = False
    input_data_file: Optional[str] = None


@dataclasses.dataclass
class ModelWarmup:
    """Warm-up requests run against the model before it is marked ready."""

    name: str
    batch_size: int
    inputs: Dict[str, WarmupInput]
    count: int
