"""Tensor: one input or output of a bound model."""

from __future__ import annotations

import dataclasses
from typing import Optional, Type, Union

import numpy as np


@dataclasses.dataclass(frozen=True)
class Tensor:
    """An input or output: shape without the batch dimension (-1 = any size), numpy dtype, name.

    `dtype` may be a numpy dtype instance, a numpy scalar type, or `bytes`/`object`
    for BYTES tensors; a dtype instance is stored as its scalar type.
    """

    shape: tuple
    dtype: Union[np.dtype, Type[np.dtype], Type[object]]
    name: Optional[str] = None
    optional: Optional[bool] = False

    def __post_init__(self):
        if isinstance(self.dtype, np.dtype):
            object.__setattr__(self, "dtype", self.dtype.type)
