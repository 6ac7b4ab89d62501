"""Refusing broken configurations, with tritonserver's messages (users grep logs for them)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


from kernel.core.errors import ErrorCode, KernelError
from kernel.core.scheduling.controls import sequence_control
from kernel.protos.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelQueuePolicy,
)

from kernel.config.constants import PLATFORMS_FOR_BACKEND, CONTROL, ENSEMBLE_PLATFORM, KIND, WILDCARD_DIM, invalid


# --------------------------------------------------------------------------- validation


def validate_config(cfg: ModelConfig, *, gpus: Sequence[int] = (), check_io: bool = True) -> None:
    """Reject configurations Triton rejects, with Triton's messages.

    `check_io=False` skips the input/output checks, for a config whose inputs
    and outputs the backend has yet to auto-complete.
    """
    _validate_model(cfg)
    _validate_instance_groups(cfg, gpus)
    if check_io:
        _validate_io(cfg)


def _validate_model(cfg: ModelConfig) -> None:
    name = cfg.name
    if not name:
        raise invalid("model configuration must specify 'name'")
    if not cfg.backend:
        if cfg.platform != ENSEMBLE_PLATFORM:
            raise invalid(f"unexpected platform type '{cfg.platform}' for {name}")
    elif cfg.platform == ENSEMBLE_PLATFORM:
        raise invalid(
            f"Ensemble model '{name}' must have platform type '{cfg.platform}' and empty backend type"
        )
    known = PLATFORMS_FOR_BACKEND.get(cfg.backend)
    if known is not None and cfg.platform not in known:
        raise invalid(f"unexpected 'platform' and 'backend' pair, got:{cfg.platform}, {cfg.backend}")
    if cfg.max_batch_size < 0:
        raise invalid(f"'max_batch_size' must be non-negative value for {name}")
    if not cfg.HasField("version_policy"):
        raise invalid(f"must specify 'version policy' for {name}")
    if cfg.HasField("dynamic_batching"):
        _validate_dynamic_batching(cfg)
    if cfg.HasField("sequence_batching"):
        _validate_sequence_batching(cfg)
    if cfg.HasField("ensemble_scheduling"):
        _validate_ensemble(cfg)
    elif cfg.platform == ENSEMBLE_PLATFORM:
        raise invalid(
            f"ensemble scheduling must be set for ensemble {name} whose platform is {ENSEMBLE_PLATFORM}"
        )
    if cfg.model_transaction_policy.decoupled and cfg.response_cache.enable:
        raise invalid(
            f"Response Cache does not currently support model {name} with 'decoupled' transaction "
            "policy. Please disable the response cache."
        )
    for control in cfg.model_metrics.metric_control:
        if not control.HasField("metric_identifier"):
            raise invalid("metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise invalid("metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise invalid("metric control must specify 'histogram_options'")
        if not control.histogram_options.buckets:
            raise invalid("histogram options must specify non-empty 'buckets'")


def _validate_dynamic_batching(cfg: ModelConfig) -> None:
    name, db = cfg.name, cfg.dynamic_batching
    for size in db.preferred_batch_size:
        if size <= 0:
            raise invalid(f"dynamic batching preferred size must be positive for {name}")
        if size > cfg.max_batch_size:
            raise invalid(f"dynamic batching preferred size must be <= max batch size for {name}")
    levels = db.priority_levels
    if levels != 0:
        if not 1 <= db.default_priority_level <= levels:
            raise invalid(f"default priority level must be in range [1, {levels}] for {name}")
        for level in db.priority_queue_policy:
            if not 1 <= level <= levels:
                raise invalid(f"priority queue policy must have priority level in range [1, {levels}] for {name}")
    if db.preserve_ordering:
        if levels > 1:
            raise invalid(f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
        policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds != 0 and p.timeout_action == ModelQueuePolicy.DELAY for p in policies):
            raise invalid(
                f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {name}"
            )


def _validate_sequence_batching(cfg: ModelConfig) -> None:
    name, sb = cfg.name, cfg.sequence_batching
    if cfg.response_cache.enable:
        raise invalid(
            f"Response Cache does not currently support model {name} with sequence batching scheduler. "
            "Please disable the response cache."
        )
    for kind in (CONTROL.CONTROL_SEQUENCE_START, CONTROL.CONTROL_SEQUENCE_END, CONTROL.CONTROL_SEQUENCE_READY):
        sequence_control(sb, name, kind, boolean=True)
    corrid = sequence_control(sb, name, CONTROL.CONTROL_SEQUENCE_CORRID, boolean=False)
    allowed = (DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32, DataType.TYPE_INT32, DataType.TYPE_STRING)
    if corrid is not None and corrid[1] not in allowed:
        raise invalid(
            f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        )
    if sb.HasField("oldest"):
        for size in sb.oldest.preferred_batch_size:
            if size <= 0:
                raise invalid(f"sequence batching preferred batch size must be positive for {name}")
            if size > cfg.max_batch_size:
                raise invalid(f"sequence batching preferred batch size must be <= max batch size for {name}")
    if sb.HasField("direct") and not 0.0 <= sb.direct.minimum_slot_utilization <= 1.0:
        raise invalid(f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}")


def _validate_ensemble(cfg: ModelConfig) -> None:
    """Structure and data flow of an ensemble (the step models are checked at load)."""
    name = cfg.name
    if cfg.platform != ENSEMBLE_PLATFORM:
        raise invalid(f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE_PLATFORM}")
    if cfg.instance_group:
        raise invalid(f"instance group should not be specified for ensemble '{name}'")
    if cfg.HasField("optimization"):
        raise invalid(f"optimization should not be specified for ensemble '{name}'")
    if cfg.model_warmup:
        raise invalid(f"model_warmup can not be specified for ensemble '{name}'")
    steps = cfg.ensemble_scheduling.step
    if not steps:
        raise invalid(f"must specify 'step' for ensemble '{name}'")

    producers: dict[str, set[str]] = {}  # ensemble tensor -> tensors its step consumes
    consumed: set[str] = set()
    for index, step in enumerate(steps):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise invalid(f"must specify '{field}' in step {index} of ensemble '{name}'")
        step_inputs = set(step.input_map.values())
        consumed |= step_inputs
        for tensor in step.output_map.values():
            if tensor in producers:
                raise invalid(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{name}' step {index}"
                )
            producers[tensor] = step_inputs

    known = set(producers) | consumed
    ready = set()
    for io in cfg.input:
        if io.name not in known:
            raise invalid(f"ensemble input '{io.name}' for ensemble {name}' is not used")
        ready.add(io.name)
    # Propagate readiness: a produced tensor is ready once all its step's inputs are.
    changed = True
    while changed:
        changed = False
        for tensor, needs in producers.items():
            if tensor not in ready and needs <= ready:
                ready.add(tensor)
                changed = True
    outputs = {io.name for io in cfg.output}
    for io in cfg.output:
        if io.name not in known:
            raise invalid(f"ensemble output '{io.name}' for ensemble {name}' is not used")
        if io.name not in ready:
            raise invalid(_not_written_message(io.name, name, producers, ready))
    for tensor in sorted(known - outputs):
        if tensor not in ready or tensor not in consumed:
            raise invalid(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _not_written_message(output: str, ensemble: str, producers: dict[str, set[str]], ready: set[str]) -> str:
    """Name the upstream tensor that nothing feeds, following unready inputs back."""
    node, seen = output, {output}
    while True:
        upstream = next((t for t in sorted(producers.get(node, ())) if t not in ready and t not in seen), None)
        if upstream is None:
            break
        seen.add(upstream)
        node = upstream
    message = f"output '{output}' for ensemble '{ensemble}' is not written"
    if node != output:
        message += f": at least one of its depending tensors, '{node}', is not connected"
    return message


# The lowest CUDA compute capability Triton places instances on (its default), quoted in its message.
MIN_COMPUTE_CAPABILITY = 6.0


def _validate_instance_groups(cfg: ModelConfig, gpus: Sequence[int]) -> None:
    if cfg.HasField("ensemble_scheduling"):
        return
    name = cfg.name
    if not cfg.instance_group:
        raise invalid(f"must specify one or more 'instance group's for {name}")
    available = set(gpus)
    for group in cfg.instance_group:
        where = f"instance group {group.name} of model {name}"
        if group.kind in (KIND.KIND_MODEL, KIND.KIND_CPU):
            if group.gpus:
                raise invalid(f"{where} has kind {KIND.Name(group.kind)} but specifies one or more GPUs")
        elif group.kind == KIND.KIND_GPU:
            if not group.gpus:
                detail = "no GPUs are available" if not available else "specifies no GPUs"
                raise invalid(f"{where} has kind KIND_GPU but {detail}")
            for gid in group.gpus:
                if gid not in available:
                    # tritonserver 2.51's words (6.0 is its --min-supported-compute-capability default).
                    listed = ", ".join(str(g) for g in sorted(available))
                    raise invalid(
                        f"{where} specifies invalid or unsupported gpu id {gid}. GPUs with at least the minimum "
                        f"required CUDA compute compatibility of {MIN_COMPUTE_CAPABILITY:f} are: {listed}"
                    )
        else:
            raise KernelError(ErrorCode.INTERNAL, f"{where} has unexpected kind {KIND.Name(group.kind)}")
        if group.profile and cfg.platform != "tensorrt_plan":
            raise invalid(
                f"{where} and platform {cfg.platform}specifies profile field which is only supported for TensorRT models"
            )


def _validate_io(cfg: ModelConfig) -> None:
    name = cfg.name
    for io in cfg.input:
        _validate_tensor(io, cfg, "model input ")
        if io.format in (ModelInput.FORMAT_NHWC, ModelInput.FORMAT_NCHW) and len(io.dims) != 3:
            raise invalid(f"model input NHWC/NCHW require 3 dims for {name}")
    for io in cfg.output:
        _validate_tensor(io, cfg, "model output ")
    # Kernel addition: Triton silently keeps the first of two same-named tensors,
    # which only ever hides a typo.
    for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
        seen: set[str] = set()
        for io in tensors:
            if io.name in seen:
                raise invalid(f"model {kind} '{io.name}' is specified more than once for {name}")
            seen.add(io.name)
    _validate_batch_io(cfg)


def _validate_tensor(io: ModelInput | ModelOutput, cfg: ModelConfig, prefix: str) -> None:
    suffix = f" for {cfg.name}"
    if not io.name:
        raise invalid(f"{prefix}must specify 'name'{suffix}")
    label = f"{prefix}'{io.name}' "
    if io.data_type == DataType.TYPE_INVALID:
        raise invalid(f"{label}must specify 'data_type'{suffix}")
    if io.data_type not in DataType.values():
        raise invalid(f"{label}has unknown data type {io.data_type}{suffix}")
    if not io.dims:
        raise invalid(f"{label}must specify 'dims'{suffix}")
    has_reshape = io.HasField("reshape")
    if has_reshape and not io.reshape.shape and cfg.max_batch_size == 0:
        raise invalid(
            f"{label}cannot have empty reshape for non-batching model as scalar tensors are not supported{suffix}"
        )
    if any(d < 1 and d != WILDCARD_DIM for d in io.dims):
        raise invalid(
            f"{label}dimension must be integer >= 1, or {WILDCARD_DIM} to indicate a variable-size dimension{suffix}"
        )
    if has_reshape:
        shape = list(io.reshape.shape)
        if any(d < 1 and d != WILDCARD_DIM for d in shape):
            raise invalid(
                f"{label}reshape dimensions must be integer >= 1, or {WILDCARD_DIM} to indicate a "
                f"variable-size dimension{suffix}"
            )
        _check_reshape(list(io.dims), shape, label, suffix)
    if io.is_shape_tensor and cfg.platform != "tensorrt_plan":
        raise invalid(f"shape tensors are only supported for TensorRT platform{suffix}")
    if io.is_non_linear_format_io and cfg.platform != "tensorrt_plan":
        raise invalid(f"Non-linear IO format is only supported for the TensorRT platform{suffix}")


def _segments(dims: Iterable[int]) -> list[int]:
    """Element counts of the runs between variable-size (-1) dimensions."""
    out, run = [], 1
    for d in dims:
        if d == WILDCARD_DIM:
            out.append(run)
            run = 1
        else:
            run *= d
    out.append(run)
    return out


def _check_reshape(dims: list[int], shape: list[int], label: str, suffix: str) -> None:
    dims_var, shape_var = WILDCARD_DIM in dims, WILDCARD_DIM in shape
    dims_count = -1 if dims_var else math.prod(dims)
    shape_count = -1 if shape_var else (math.prod(shape) if shape else 0)
    # An empty reshape means "scalar", which needs exactly one element in dims.
    if dims_count != shape_count and not (shape_count == 0 and dims_count == 1):
        raise invalid(f"{label}has different size for dims and reshape{suffix}")
    if dims_var:
        a, b = _segments(dims), _segments(shape)
        if len(a) != len(b):
            raise invalid(
                f"{label}has different number of variable-size dimensions for dims and reshape{suffix}"
            )
        if a != b:
            raise invalid(f"{label}has different size for dims and reshape{suffix}")


def _validate_batch_io(cfg: ModelConfig) -> None:
    suffix = f" for {cfg.name}"
    inputs = {io.name for io in cfg.input}
    outputs = {io.name for io in cfg.output}
    for bi in cfg.batch_input:
        if len(bi.source_input) != 1:
            kind = type(bi).Kind.Name(bi.kind) if bi.kind in type(bi).Kind.values() else str(bi.kind)
            raise invalid(f"batch input kind '{kind}' expects 1 source input, got {len(bi.source_input)}{suffix}")
        if bi.data_type not in (DataType.TYPE_INT32, DataType.TYPE_FP32):
            raise invalid(f"batch input data type must be TYPE_INT32 or TYPE_FP32{suffix}")
        for src in bi.source_input:
            if src not in inputs:
                raise invalid(f"unknown source input name '{src}'{suffix}")
    for bo in cfg.batch_output:
        if len(bo.source_input) != 1:
            raise invalid(
                f"batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, "
                f"got {len(bo.source_input)}{suffix}"
            )
        for src in bo.source_input:
            if src not in inputs:
                raise invalid(f"unknown source input name '{src}'{suffix}")
        targets: set[str] = set()
        for target in bo.target_name:
            if target not in outputs:
                raise invalid(f"unknown target output name '{target}'{suffix}")
            if target in targets:
                raise invalid(f"target output name '{target}' can only be specified once{suffix}")
            targets.add(target)
