"""The model configuration a server reports (JSON) turned into PyTriton's TritonModelConfig.

HTTP and gRPC report the same protobuf as JSON, but gRPC's rendering leaves out
default values and writes 64-bit integers as strings; both are accepted here.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np
import tritonclient.utils

from kernel.model_config.common import DeviceKind, DynamicBatcher
from kernel.model_config.triton_model_config import TensorSpec, TritonModelConfig


def numpy_type(data_type: str):
    """TYPE_FP32 -> np.float32; TYPE_STRING -> np.bytes_; TYPE_BOOL -> np.dtype('bool') (as PyTriton gives it)."""
    name = data_type[5:] if data_type.startswith("TYPE_") else data_type
    if name == "STRING":
        return np.bytes_
    dtype = tritonclient.utils.triton_to_np_dtype(name)
    if dtype is None:
        raise ValueError(f"unsupported data type {data_type!r}")
    return np.dtype("bool") if dtype is bool else dtype


def _tensor(doc: Dict[str, Any]) -> TensorSpec:
    return TensorSpec(
        name=doc["name"],
        shape=tuple(int(d) for d in doc.get("dims", ())),
        dtype=numpy_type(doc.get("data_type", "TYPE_INVALID")),
        optional=bool(doc.get("optional", False)),
    )


def _batcher(doc: Optional[Dict[str, Any]]) -> Optional[DynamicBatcher]:
    if doc is None:
        return None
    return DynamicBatcher(
        max_queue_delay_microseconds=int(doc.get("max_queue_delay_microseconds", 0)),
        preferred_batch_size=[int(n) for n in doc.get("preferred_batch_size", [])] or None,
        preserve_ordering=bool(doc.get("preserve_ordering", False)),
        priority_levels=int(doc.get("priority_levels", 0)),
        default_priority_level=int(doc.get("default_priority_level", 0)),
    )


def config_from_json(doc: Dict[str, Any]) -> TritonModelConfig:
    max_batch_size = int(doc.get("max_batch_size", 0))
    parameters = doc.get("parameters") or {}
    return TritonModelConfig(
        model_name=doc.get("name", ""),
        max_batch_size=max_batch_size,
        batching=max_batch_size > 0,
        batcher=_batcher(doc.get("dynamic_batching")),
        instance_group={
            DeviceKind(group.get("kind", "KIND_AUTO")): (int(group["count"]) if "count" in group else None)
            for group in doc.get("instance_group", [])
        },
        decoupled=bool(doc.get("model_transaction_policy", {}).get("decoupled", False)),
        backend_parameters={k: v.get("string_value", "") for k, v in parameters.items()},
        inputs=[_tensor(t) for t in doc.get("input", [])] or None,
        outputs=[_tensor(t) for t in doc.get("output", [])] or None,
    )
