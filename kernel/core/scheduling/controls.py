"""The control inputs of a sequence batcher (START, END, READY, CORRID), read from its config.

Used by the sequence batcher to build its controls and by config validation (kernel.config) to
refuse malformed declarations with Triton's messages.
"""

from __future__ import annotations

from typing import Any

from kernel.core.errors import ErrorCode, KernelError
from kernel.protos.model_config_pb2 import DataType, ModelSequenceBatching


def _invalid(msg: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, msg)


def sequence_control(
    batcher: ModelSequenceBatching, model_name: str, kind: int, *, boolean: bool = True
) -> tuple[str, int, tuple[Any, Any] | None] | None:
    """Find the control input of `kind` (a ModelSequenceBatching.Control.Kind).

    Returns (tensor name, data type, (false, true) values) or None when the
    batcher has no such control. Boolean controls (START/END/READY) carry their
    false/true values; typed ones (CORRID) carry a data type and no values.
    Raises Triton's errors for malformed control declarations.
    """
    kind_name = ModelSequenceBatching.Control.Kind.Name(kind)
    seen_names: set[str] = set()
    found: tuple[str, int, tuple[Any, Any] | None] | None = None
    for control_input in batcher.control_input:
        if not control_input.name:
            raise _invalid(f"sequence batching control tensor must have a name for {model_name}")
        if control_input.name in seen_names:
            raise _invalid(
                f"sequence batching control tensor '{control_input.name}' is specified for multiple "
                f"control kinds for {model_name}"
            )
        seen_names.add(control_input.name)
        for control in control_input.control:
            if control.kind != kind:
                continue
            if found is not None:
                raise _invalid(f"sequence batching specifies multiple {kind_name} tensors for {model_name}")
            lists = [
                ("int32_false_true", control.int32_false_true, DataType.TYPE_INT32),
                ("fp32_false_true", control.fp32_false_true, DataType.TYPE_FP32),
                ("bool_false_true", control.bool_false_true, DataType.TYPE_BOOL),
            ]
            given = [entry for entry in lists if len(entry[1]) > 0]
            if not boolean:
                if given:
                    raise _invalid(
                        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                        f"'bool_false_true' for {kind_name} for {model_name}"
                    )
                found = (control_input.name, control.data_type, None)
                continue
            if not given:
                raise _invalid(
                    "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                    f"'bool_false_true' for {kind_name} for {model_name}"
                )
            if len(given) > 1:
                raise _invalid(
                    "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
                    f"and 'bool_false_true' for {kind_name} for {model_name}"
                )
            label, values, dtype = given[0]
            if len(values) != 2:
                raise _invalid(
                    f"sequence batching control '{label}' must have exactly 2 entries for {kind_name} for {model_name}"
                )
            found = (control_input.name, dtype, (values[0], values[1]))
    return found
