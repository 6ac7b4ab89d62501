"""Request and Response: what a bound callable sees.

A callable bound with Triton.bind() without @batch receives a list of Request
objects, one per client request in the batch the scheduler formed, and
returns one dict of outputs per request. Both behave like dicts of numpy arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Union

import numpy as np


class _ArrayMapping:
    """Dict-like access to `data` (name -> numpy array)."""

    data: Dict[str, np.ndarray]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.data[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.data[name] = value

    def __delitem__(self, name: str) -> None:
        del self.data[name]

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self):
        return iter(self.data)

    def __contains__(self, name: object) -> bool:
        return name in self.data

    def items(self):
        return self.data.items()

    def keys(self):
        return self.data.keys()

    def values(self):
        return self.data.values()


@dataclasses.dataclass
class Request(_ArrayMapping):
    """One client request: its inputs, its parameters, the outputs it asked for (None = all)."""

    data: Dict[str, np.ndarray]
    parameters: Optional[Dict[str, Union[str, int, bool]]] = None
    span: Optional[Any] = None
    requested_output_names: Optional[List[str]] = None


@dataclasses.dataclass
class Response(_ArrayMapping):
    data: Dict[str, np.ndarray]


Requests = List[Request]
Responses = List[Response]
