"""ModelConfig: how a bound model is served (batching, batcher, decoupled)."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from kernel.model_config.common import DynamicBatcher, ModelWarmup


@dataclasses.dataclass
class ModelConfig:
    """Serving options of a model bound with Triton.bind().

    batching=False serves the model without a batch dimension (max_batch_size 0);
    otherwise requests are batched by the core's dynamic batcher up to max_batch_size.
    """

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: Optional[List[ModelWarmup]] = None
