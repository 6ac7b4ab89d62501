"""config.pbtxt: parsing, Triton-identical JSON rendering, auto-completion, validation.

A model's configuration goes through the same stages as in tritonserver:

    parse_config_text / load_model_config      (text format, or empty if absent)
    normalize_config                           (server-side defaults)
    [backend auto-complete -> config_from_dict / apply_autocomplete, normalize again]
    validate_config                            (reject broken configurations)
    config_to_dict / config_to_json            (GET .../config, initialize(args))

The JSON rendering must equal what Triton serves byte-for-byte in content, since
models parse it in `initialize` and clients read it from `/v2/models/<m>/config`.
Error messages follow Triton's wording because users grep logs for them.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.scheduling.controls import sequence_control
from kernel.protos.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelInstanceGroup,
    ModelOutput,
    ModelQueuePolicy,
    ModelSequenceBatching,
)

__all__ = [
    "ModelConfig",
    "parse_config_text",
    "config_to_dict",
    "config_to_json",
    "config_from_dict",
    "config_from_json",
    "normalize_config",
    "apply_default_max_batch_size",
    "apply_autocomplete",
    "validate_config",
    "sequence_control",
    "PYTHON_BACKEND",
    "PYTHON_FILENAME",
    "ENSEMBLE_PLATFORM",
    "WILDCARD_DIM",
]

PYTHON_BACKEND = "python"
PYTHON_FILENAME = "model.py"
ENSEMBLE_PLATFORM = "ensemble"
WILDCARD_DIM = -1
SEQUENCE_IDLE_DEFAULT_US = 1_000_000

_Kind = ModelInstanceGroup.Kind
_Control = ModelSequenceBatching.Control


def _invalid(msg: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, msg)


# --------------------------------------------------------------------------- parsing


def parse_config_text(text: str, source: str) -> ModelConfig:
    """Parse config.pbtxt text; `source` (usually the file path) is named in errors."""
    cfg = ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise _invalid(f"failed to read text proto from {source}: {exc}") from None
    return cfg


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from Triton-style JSON data (as from config_to_dict).

    64-bit fields may be ints or strings. Enum names are matched
    case-insensitively, as Triton's own JSON reader does for config overrides.
    """
    if not isinstance(d, dict):
        raise _invalid(f"model configuration must be a JSON object, got {type(d).__name__}")
    cfg = ModelConfig()
    try:
        json_format.ParseDict(_upper_enums(d, ModelConfig.DESCRIPTOR), cfg, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise _invalid(f"failed to parse model configuration: {exc}") from None
    return cfg


def config_from_json(text: str | bytes) -> ModelConfig:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _invalid(f"model configuration is not valid JSON: {exc}") from None
    return config_from_dict(data)


def _upper_enums(value: Any, desc: Descriptor) -> Any:
    """Copy of `value` where lowercase enum names are upper-cased if that makes them valid."""
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        field = desc.fields_by_name.get(key) if isinstance(key, str) else None
        if field is None:
            field = next((f for f in desc.fields if f.json_name == key), None)
        if field is None:
            out[key] = item  # let ParseDict report the unknown field
        elif _is_map(field):
            vfield = field.message_type.fields_by_name["value"]
            out[key] = {k: _upper_one(vfield, v) for k, v in item.items()} if isinstance(item, dict) else item
        elif field.is_repeated and isinstance(item, list):
            out[key] = [_upper_one(field, v) for v in item]
        else:
            out[key] = _upper_one(field, item)
    return out


def _upper_one(field: FieldDescriptor, item: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _upper_enums(item, field.message_type)
    if field.type == FieldDescriptor.TYPE_ENUM and isinstance(item, str):
        if item not in field.enum_type.values_by_name and item.upper() in field.enum_type.values_by_name:
            return item.upper()
    return item


# --------------------------------------------------------------------------- JSON rendering
#
# Triton prints the config with protobuf's JSON printer (proto field names, every
# field without presence printed even at its default) and then turns a fixed list
# of 64-bit fields back from strings into numbers. We render the same thing by
# walking the descriptor in declaration order (the order Triton's output uses).

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The JSON object Triton serves at /v2/models/<m>/config for this config."""
    if cfg.ByteSize() == 0:
        return {}  # Triton renders an all-default config as nothing at all
    out = _message_to_dict(cfg)
    _fix_int64_fields(out)
    return out


def config_to_json(cfg: ModelConfig) -> str:
    """Compact JSON text of config_to_dict (Triton writes it without whitespace)."""
    return json.dumps(config_to_dict(cfg), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _message_to_dict(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # Triton's printer lays out every field in declaration order except scalar
    # members of a oneof, which come last (observed: InitialState prints
    # "name" before "zero_data").
    trailing: list[FieldDescriptor] = []
    for field in msg.DESCRIPTOR.fields:
        name = field.name
        if field.containing_oneof is not None and field.type != FieldDescriptor.TYPE_MESSAGE:
            trailing.append(field)
            continue
        if _is_map(field):
            kfield = field.message_type.fields_by_name["key"]
            vfield = field.message_type.fields_by_name["value"]
            entries = getattr(msg, name)
            # Triton's order is protobuf's internal hash order (not reproducible);
            # sorting keeps ours deterministic.
            out[name] = {_map_key(kfield, k): _scalar(vfield, entries[k]) for k in sorted(entries)}
        elif field.is_repeated:
            out[name] = [_scalar(field, v) for v in getattr(msg, name)]
        elif field.type == FieldDescriptor.TYPE_MESSAGE or field.containing_oneof is not None:
            # Fields with presence are printed only when set.
            if msg.HasField(name):
                out[name] = _scalar(field, getattr(msg, name))
        else:
            out[name] = _scalar(field, getattr(msg, name))
    for field in sorted(trailing, key=lambda f: f.number):
        if msg.HasField(field.name):
            out[field.name] = _scalar(field, getattr(msg, field.name))
    return out


def _map_key(field: FieldDescriptor, key: Any) -> str:
    if field.type == FieldDescriptor.TYPE_BOOL:
        return "true" if key else "false"
    return str(key)


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    ftype = field.type
    if ftype == FieldDescriptor.TYPE_MESSAGE:
        return _message_to_dict(value)
    if ftype == FieldDescriptor.TYPE_ENUM:
        ev = field.enum_type.values_by_number.get(value)
        return ev.name if ev is not None else value
    if ftype in _INT64_TYPES:
        return str(value)  # protobuf JSON quotes 64-bit integers
    if ftype == FieldDescriptor.TYPE_FLOAT:
        return _json_number(_shortest_float32(value))
    if ftype == FieldDescriptor.TYPE_DOUBLE:
        return _json_number(value)
    if ftype == FieldDescriptor.TYPE_BYTES:
        import base64

        return base64.b64encode(value).decode("ascii")
    return value


def _shortest_float32(value: float) -> float:
    """The shortest decimal that reads back as the same float32 (0.1f -> 0.1)."""
    if not math.isfinite(value):
        return value
    for digits in range(6, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", candidate))[0] == value:
            return candidate
    return value


def _json_number(value: float) -> Any:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    # C++ prints integral floats without a fraction (1.0 -> 1).
    if value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value


def _to_int_list(obj: dict[str, Any], key: str) -> None:
    if key in obj:
        obj[key] = [int(v) for v in obj[key]]


def _to_int(obj: dict[str, Any], key: str) -> None:
    if key in obj:
        obj[key] = int(obj[key])


def _fix_int64_fields(cfg: dict[str, Any]) -> None:
    """Turn back into numbers exactly the 64-bit fields Triton turns back.

    Others stay strings in Triton's output, so they do here too:
    optimization.cuda.graph_spec[*].input[*].dim (and graph_lower_bound's),
    instance_group[*].secondary_devices[*].device_id, the keys of
    dynamic_batching.priority_queue_policy, and - because Triton looks for them
    in the wrong object - sequence_batching.state[*].initial_state[*].dims.
    """
    for key in ("input", "output"):
        for io in cfg.get(key, ()):
            _to_int_list(io, "dims")
            if "reshape" in io:
                _to_int_list(io["reshape"], "shape")
    specific = cfg.get("version_policy", {}).get("specific")
    if specific is not None:
        _to_int_list(specific, "versions")
    db = cfg.get("dynamic_batching")
    if db is not None:
        for key in ("max_queue_delay_microseconds", "priority_levels", "default_priority_level"):
            _to_int(db, key)
        if "default_queue_policy" in db:
            _to_int(db["default_queue_policy"], "default_timeout_microseconds")
        for policy in db.get("priority_queue_policy", {}).values():
            _to_int(policy, "default_timeout_microseconds")
    sb = cfg.get("sequence_batching")
    if sb is not None:
        _to_int(sb, "max_sequence_idle_microseconds")
        for strategy in ("oldest", "direct"):
            if strategy in sb:
                _to_int(sb[strategy], "max_queue_delay_microseconds")
        for state in sb.get("state", ()):
            _to_int_list(state, "dims")
    ens = cfg.get("ensemble_scheduling")
    if ens is not None:
        for step in ens.get("step", ()):
            _to_int(step, "model_version")
    for warmup in cfg.get("model_warmup", ()):
        for winput in warmup.get("inputs", {}).values():
            _to_int_list(winput, "dims")


# --------------------------------------------------------------------------- auto-completion

# Platform -> backend that Triton fills in when only the platform is given.
_BACKEND_FOR_PLATFORM = {
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "libtorch": "pytorch",
    "torch_aoti": "pytorch",
}
# Backends whose platform must agree with the backend (Triton's "known" backends).
_PLATFORMS_FOR_BACKEND = {
    "tensorflow": {"tensorflow_savedmodel", "tensorflow_graphdef"},
    "tensorrt": {"tensorrt_plan"},
    "onnxruntime": {"onnxruntime_onnx"},
    "pytorch": {"pytorch_libtorch", "torch_aoti"},
}
# Backend -> the platform Triton fills in when only the backend is given.
_PLATFORM_FOR_BACKEND = {"tensorrt": "tensorrt_plan", "onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch"}
_DEFAULT_FILENAME_FOR_PLATFORM = {
    "tensorflow_savedmodel": "model.savedmodel",
    "tensorflow_graphdef": "model.graphdef",
    "tensorrt_plan": "model.plan",
    "onnxruntime_onnx": "model.onnx",
    "pytorch_libtorch": "model.pt",
    "libtorch": "model.pt",
    "torch_aoti": "model.pt2",
}
# Backends that start two CPU instances per group by default.
_TWO_CPU_INSTANCE_BACKENDS = frozenset({"tensorflow", "onnxruntime"})


def normalize_config(
    cfg: ModelConfig,
    model_name: str,
    *,
    default_max_batch_size: int = 4,
    autocomplete_supports_batching: bool | None = None,
    model_path: Path | None = None,
    gpus: Sequence[int] = (),
) -> None:
    """Fill in what Triton's core fills in before a model loads (in place, idempotent).

    - name from the folder; a different explicit name is an error,
    - backend "python" and default_model_filename "model.py" for Python models
      (detected from model.py in the first version folder when `model_path` is given),
    - version_policy latest{num_versions: 1},
    - dynamic_batching.preferred_batch_size [max_batch_size] when empty,
      sequence_batching idle timeout 1 s and oldest.preferred_batch_size,
    - optimization.{input,output}_pinned_memory.enable = true,
    - instance groups: one default group named after the model, unnamed groups
      named "<model>_<index>", KIND_AUTO resolved (CPU when `gpus` is empty),
      count 1, KIND_GPU groups get every GPU in `gpus`.

    `autocomplete_supports_batching` is what a backend's own auto-complete
    concluded about batching; see apply_default_max_batch_size.
    """
    _complete_backend_fields(cfg, model_name, model_path)
    if cfg.name != model_name:
        raise _invalid(
            f"unexpected directory name '{model_name}' for model '{cfg.name}', "
            "directory name must equal model name"
        )
    if autocomplete_supports_batching is not None:
        apply_default_max_batch_size(cfg, default_max_batch_size, supports_batching=autocomplete_supports_batching)
    _normalize_scheduling(cfg)
    _normalize_instance_groups(cfg, gpus)


def _first_version_dir(model_path: Path) -> Path | None:
    # Triton inspects the first sub-folder in name order; hidden folders are
    # skipped here so an editor's or notebook's dot-folder cannot hide model.py.
    try:
        subdirs = sorted(p for p in model_path.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return None
    return subdirs[0] if subdirs else None


def _complete_backend_fields(cfg: ModelConfig, model_name: str, model_path: Path | None) -> None:
    if not cfg.name:
        cfg.name = model_name
    if cfg.platform == ENSEMBLE_PLATFORM:
        return
    if not cfg.backend and cfg.platform in _BACKEND_FOR_PLATFORM:
        cfg.backend = _BACKEND_FOR_PLATFORM[cfg.platform]
    if cfg.backend in _PLATFORMS_FOR_BACKEND:
        if not cfg.platform and cfg.backend in _PLATFORM_FOR_BACKEND:
            cfg.platform = _PLATFORM_FOR_BACKEND[cfg.backend]
        if not cfg.default_model_filename and cfg.platform in _DEFAULT_FILENAME_FOR_PLATFORM:
            cfg.default_model_filename = _DEFAULT_FILENAME_FOR_PLATFORM[cfg.platform]
        return
    if not cfg.backend:
        if cfg.default_model_filename == PYTHON_FILENAME:
            cfg.backend = PYTHON_BACKEND
        elif not cfg.platform and not cfg.default_model_filename and model_path is not None:
            version_dir = _first_version_dir(model_path)
            if version_dir is not None and (version_dir / PYTHON_FILENAME).exists():
                cfg.backend = PYTHON_BACKEND
    if cfg.backend == PYTHON_BACKEND:
        if not cfg.default_model_filename:
            cfg.default_model_filename = PYTHON_FILENAME
        return
    if not cfg.backend and not cfg.platform and not cfg.default_model_filename and model_path is not None:
        # Last resort, as in Triton: a folder named "<anything>.<backend>".
        _, dot, backend = model_name.partition(".")
        if not dot:
            raise _invalid(
                f"Invalid model name: Could not determine backend for model '{model_name}' with no "
                "backend in model configuration. Expected model name of the form 'model.<backend_name>'."
            )
        cfg.backend = backend
        cfg.default_model_filename = f"model.{backend}"


def _normalize_scheduling(cfg: ModelConfig) -> None:
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
    choice = cfg.WhichOneof("scheduling_choice")
    if choice == "dynamic_batching":
        db = cfg.dynamic_batching
        if not db.preferred_batch_size and cfg.max_batch_size > 0:
            db.preferred_batch_size.append(cfg.max_batch_size)
    elif choice == "sequence_batching":
        sb = cfg.sequence_batching
        if sb.max_sequence_idle_microseconds == 0:
            sb.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if sb.HasField("oldest") and not sb.oldest.preferred_batch_size and cfg.max_batch_size > 0:
            sb.oldest.preferred_batch_size.append(cfg.max_batch_size)
    if choice != "ensemble_scheduling":
        opt = cfg.optimization
        if not opt.HasField("input_pinned_memory"):
            opt.input_pinned_memory.enable = True
        if not opt.HasField("output_pinned_memory"):
            opt.output_pinned_memory.enable = True


def _normalize_instance_groups(cfg: ModelConfig, gpus: Sequence[int]) -> None:
    if cfg.HasField("ensemble_scheduling"):
        return  # ensembles run no instances of their own
    available = set(gpus)
    if not cfg.instance_group:
        # The Python backend prefers GPU instances when GPUs exist, else CPU.
        default = cfg.instance_group.add()
        default.name = cfg.name  # note: no "_0" suffix on the default group
        default.kind = _Kind.KIND_GPU if available else _Kind.KIND_CPU
    for index, group in enumerate(cfg.instance_group):
        if not group.name:
            group.name = f"{cfg.name}_{index}"
        if group.kind == _Kind.KIND_AUTO:
            usable = bool(available) and all(g in available for g in group.gpus)
            group.kind = _Kind.KIND_GPU if usable else _Kind.KIND_CPU
        if group.count < 1:
            two = group.kind == _Kind.KIND_CPU and cfg.backend in _TWO_CPU_INSTANCE_BACKENDS
            group.count = 2 if two else 1
        if group.kind == _Kind.KIND_GPU and not group.gpus:
            group.gpus.extend(sorted(available))


def apply_default_max_batch_size(cfg: ModelConfig, default: int, *, supports_batching: bool | None = None) -> None:
    """Triton's `--backend-config=default-max-batch-size` rule (default 4).

    Triton leaves it to each backend's own auto-complete: a backend that has
    determined the model *can* batch (ONNX Runtime does) sets an unset (0)
    max_batch_size to the default, and turns on dynamic_batching when the
    result is > 1 and no scheduler is configured; a model it found unable to
    batch must keep max_batch_size 0. The Python backend never consults the
    default - a Python model's batching comes only from config.pbtxt or its
    `auto_complete_config` - so with `supports_batching` None (the Python case)
    this changes nothing, which matches what Triton serves for Python models.
    """
    if supports_batching is None:
        return
    if not supports_batching:
        if cfg.max_batch_size != 0:
            raise _invalid(
                f"autofill failed for model '{cfg.name}': model does not support batching while "
                "non-zero max_batch_size is specified"
            )
        return
    if cfg.max_batch_size == 0:
        cfg.max_batch_size = max(int(default), 0)
    if cfg.max_batch_size > 1 and cfg.WhichOneof("scheduling_choice") is None:
        cfg.dynamic_batching.SetInParent()


def apply_autocomplete(cfg: ModelConfig, completed: ModelConfig) -> None:
    """Merge a backend's auto-completed config into `cfg` the way Triton does.

    Only max_batch_size, inputs, outputs, the scheduler (when none was set) and
    model_transaction_policy are taken from `completed`; everything else the
    model returns is ignored. Run normalize_config afterwards (Triton does).
    """
    cfg.max_batch_size = completed.max_batch_size
    del cfg.input[:]
    cfg.input.extend(completed.input)
    del cfg.output[:]
    cfg.output.extend(completed.output)
    mine = cfg.WhichOneof("scheduling_choice")
    theirs = completed.WhichOneof("scheduling_choice")
    if mine is None:
        if theirs is not None:
            getattr(cfg, theirs).CopyFrom(getattr(completed, theirs))
    elif theirs is not None and theirs != mine:
        raise KernelError(
            ErrorCode.INTERNAL,
            f"Cannot update scheduling choice from {mine} to {theirs} when auto-completing.",
        )
    if completed.HasField("model_transaction_policy"):
        cfg.model_transaction_policy.decoupled = completed.model_transaction_policy.decoupled


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
        raise _invalid("model configuration must specify 'name'")
    if not cfg.backend:
        if cfg.platform != ENSEMBLE_PLATFORM:
            raise _invalid(f"unexpected platform type '{cfg.platform}' for {name}")
    elif cfg.platform == ENSEMBLE_PLATFORM:
        raise _invalid(
            f"Ensemble model '{name}' must have platform type '{cfg.platform}' and empty backend type"
        )
    known = _PLATFORMS_FOR_BACKEND.get(cfg.backend)
    if known is not None and cfg.platform not in known:
        raise _invalid(f"unexpected 'platform' and 'backend' pair, got:{cfg.platform}, {cfg.backend}")
    if cfg.max_batch_size < 0:
        raise _invalid(f"'max_batch_size' must be non-negative value for {name}")
    if not cfg.HasField("version_policy"):
        raise _invalid(f"must specify 'version policy' for {name}")
    if cfg.HasField("dynamic_batching"):
        _validate_dynamic_batching(cfg)
    if cfg.HasField("sequence_batching"):
        _validate_sequence_batching(cfg)
    if cfg.HasField("ensemble_scheduling"):
        _validate_ensemble(cfg)
    elif cfg.platform == ENSEMBLE_PLATFORM:
        raise _invalid(
            f"ensemble scheduling must be set for ensemble {name} whose platform is {ENSEMBLE_PLATFORM}"
        )
    if cfg.model_transaction_policy.decoupled and cfg.response_cache.enable:
        raise _invalid(
            f"Response Cache does not currently support model {name} with 'decoupled' transaction "
            "policy. Please disable the response cache."
        )
    for control in cfg.model_metrics.metric_control:
        if not control.HasField("metric_identifier"):
            raise _invalid("metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise _invalid("metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise _invalid("metric control must specify 'histogram_options'")
        if not control.histogram_options.buckets:
            raise _invalid("histogram options must specify non-empty 'buckets'")


def _validate_dynamic_batching(cfg: ModelConfig) -> None:
    name, db = cfg.name, cfg.dynamic_batching
    for size in db.preferred_batch_size:
        if size <= 0:
            raise _invalid(f"dynamic batching preferred size must be positive for {name}")
        if size > cfg.max_batch_size:
            raise _invalid(f"dynamic batching preferred size must be <= max batch size for {name}")
    levels = db.priority_levels
    if levels != 0:
        if not 1 <= db.default_priority_level <= levels:
            raise _invalid(f"default priority level must be in range [1, {levels}] for {name}")
        for level in db.priority_queue_policy:
            if not 1 <= level <= levels:
                raise _invalid(f"priority queue policy must have priority level in range [1, {levels}] for {name}")
    if db.preserve_ordering:
        if levels > 1:
            raise _invalid(f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
        policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds != 0 and p.timeout_action == ModelQueuePolicy.DELAY for p in policies):
            raise _invalid(
                f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {name}"
            )


def _validate_sequence_batching(cfg: ModelConfig) -> None:
    name, sb = cfg.name, cfg.sequence_batching
    if cfg.response_cache.enable:
        raise _invalid(
            f"Response Cache does not currently support model {name} with sequence batching scheduler. "
            "Please disable the response cache."
        )
    for kind in (_Control.CONTROL_SEQUENCE_START, _Control.CONTROL_SEQUENCE_END, _Control.CONTROL_SEQUENCE_READY):
        sequence_control(sb, name, kind, boolean=True)
    corrid = sequence_control(sb, name, _Control.CONTROL_SEQUENCE_CORRID, boolean=False)
    allowed = (DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32, DataType.TYPE_INT32, DataType.TYPE_STRING)
    if corrid is not None and corrid[1] not in allowed:
        raise _invalid(
            f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        )
    if sb.HasField("oldest"):
        for size in sb.oldest.preferred_batch_size:
            if size <= 0:
                raise _invalid(f"sequence batching preferred batch size must be positive for {name}")
            if size > cfg.max_batch_size:
                raise _invalid(f"sequence batching preferred batch size must be <= max batch size for {name}")
    if sb.HasField("direct") and not 0.0 <= sb.direct.minimum_slot_utilization <= 1.0:
        raise _invalid(f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}")


def _validate_ensemble(cfg: ModelConfig) -> None:
    """Structure and data flow of an ensemble (the step models are checked at load)."""
    name = cfg.name
    if cfg.platform != ENSEMBLE_PLATFORM:
        raise _invalid(f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE_PLATFORM}")
    if cfg.instance_group:
        raise _invalid(f"instance group should not be specified for ensemble '{name}'")
    if cfg.HasField("optimization"):
        raise _invalid(f"optimization should not be specified for ensemble '{name}'")
    if cfg.model_warmup:
        raise _invalid(f"model_warmup can not be specified for ensemble '{name}'")
    steps = cfg.ensemble_scheduling.step
    if not steps:
        raise _invalid(f"must specify 'step' for ensemble '{name}'")

    producers: dict[str, set[str]] = {}  # ensemble tensor -> tensors its step consumes
    consumed: set[str] = set()
    for index, step in enumerate(steps):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise _invalid(f"must specify '{field}' in step {index} of ensemble '{name}'")
        step_inputs = set(step.input_map.values())
        consumed |= step_inputs
        for tensor in step.output_map.values():
            if tensor in producers:
                raise _invalid(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{name}' step {index}"
                )
            producers[tensor] = step_inputs

    known = set(producers) | consumed
    ready = set()
    for io in cfg.input:
        if io.name not in known:
            raise _invalid(f"ensemble input '{io.name}' for ensemble {name}' is not used")
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
            raise _invalid(f"ensemble output '{io.name}' for ensemble {name}' is not used")
        if io.name not in ready:
            raise _invalid(_not_written_message(io.name, name, producers, ready))
    for tensor in sorted(known - outputs):
        if tensor not in ready or tensor not in consumed:
            raise _invalid(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


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


def _validate_instance_groups(cfg: ModelConfig, gpus: Sequence[int]) -> None:
    if cfg.HasField("ensemble_scheduling"):
        return
    name = cfg.name
    if not cfg.instance_group:
        raise _invalid(f"must specify one or more 'instance group's for {name}")
    available = set(gpus)
    for group in cfg.instance_group:
        where = f"instance group {group.name} of model {name}"
        if group.kind in (_Kind.KIND_MODEL, _Kind.KIND_CPU):
            if group.gpus:
                raise _invalid(f"{where} has kind {_Kind.Name(group.kind)} but specifies one or more GPUs")
        elif group.kind == _Kind.KIND_GPU:
            if not group.gpus:
                detail = "no GPUs are available" if not available else "specifies no GPUs"
                raise _invalid(f"{where} has kind KIND_GPU but {detail}")
            for gid in group.gpus:
                if gid not in available:
                    listed = ", ".join(str(g) for g in sorted(available))
                    raise _invalid(f"{where} specifies invalid or unsupported gpu id {gid}. Available GPUs are: {listed}")
        else:
            raise KernelError(ErrorCode.INTERNAL, f"{where} has unexpected kind {_Kind.Name(group.kind)}")
        if group.profile and cfg.platform != "tensorrt_plan":
            raise _invalid(
                f"{where} and platform {cfg.platform}specifies profile field which is only supported for TensorRT models"
            )


def _validate_io(cfg: ModelConfig) -> None:
    name = cfg.name
    for io in cfg.input:
        _validate_tensor(io, cfg, "model input ")
        if io.format in (ModelInput.FORMAT_NHWC, ModelInput.FORMAT_NCHW) and len(io.dims) != 3:
            raise _invalid(f"model input NHWC/NCHW require 3 dims for {name}")
    for io in cfg.output:
        _validate_tensor(io, cfg, "model output ")
    # Kernel addition: Triton silently keeps the first of two same-named tensors,
    # which only ever hides a typo.
    for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
        seen: set[str] = set()
        for io in tensors:
            if io.name in seen:
                raise _invalid(f"model {kind} '{io.name}' is specified more than once for {name}")
            seen.add(io.name)
    _validate_batch_io(cfg)


def _validate_tensor(io: ModelInput | ModelOutput, cfg: ModelConfig, prefix: str) -> None:
    suffix = f" for {cfg.name}"
    if not io.name:
        raise _invalid(f"{prefix}must specify 'name'{suffix}")
    label = f"{prefix}'{io.name}' "
    if io.data_type == DataType.TYPE_INVALID:
        raise _invalid(f"{label}must specify 'data_type'{suffix}")
    if io.data_type not in DataType.values():
        raise _invalid(f"{label}has unknown data type {io.data_type}{suffix}")
    if not io.dims:
        raise _invalid(f"{label}must specify 'dims'{suffix}")
    has_reshape = io.HasField("reshape")
    if has_reshape and not io.reshape.shape and cfg.max_batch_size == 0:
        raise _invalid(
            f"{label}cannot have empty reshape for non-batching model as scalar tensors are not supported{suffix}"
        )
    if any(d < 1 and d != WILDCARD_DIM for d in io.dims):
        raise _invalid(
            f"{label}dimension must be integer >= 1, or {WILDCARD_DIM} to indicate a variable-size dimension{suffix}"
        )
    if has_reshape:
        shape = list(io.reshape.shape)
        if any(d < 1 and d != WILDCARD_DIM for d in shape):
            raise _invalid(
                f"{label}reshape dimensions must be integer >= 1, or {WILDCARD_DIM} to indicate a "
                f"variable-size dimension{suffix}"
            )
        _check_reshape(list(io.dims), shape, label, suffix)
    if io.is_shape_tensor and cfg.platform != "tensorrt_plan":
        raise _invalid(f"shape tensors are only supported for TensorRT platform{suffix}")
    if io.is_non_linear_format_io and cfg.platform != "tensorrt_plan":
        raise _invalid(f"Non-linear IO format is only supported for the TensorRT platform{suffix}")


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
        raise _invalid(f"{label}has different size for dims and reshape{suffix}")
    if dims_var:
        a, b = _segments(dims), _segments(shape)
        if len(a) != len(b):
            raise _invalid(
                f"{label}has different number of variable-size dimensions for dims and reshape{suffix}"
            )
        if a != b:
            raise _invalid(f"{label}has different size for dims and reshape{suffix}")


def _validate_batch_io(cfg: ModelConfig) -> None:
    suffix = f" for {cfg.name}"
    inputs = {io.name for io in cfg.input}
    outputs = {io.name for io in cfg.output}
    for bi in cfg.batch_input:
        if len(bi.source_input) != 1:
            kind = type(bi).Kind.Name(bi.kind) if bi.kind in type(bi).Kind.values() else str(bi.kind)
            raise _invalid(f"batch input kind '{kind}' expects 1 source input, got {len(bi.source_input)}{suffix}")
        if bi.data_type not in (DataType.TYPE_INT32, DataType.TYPE_FP32):
            raise _invalid(f"batch input data type must be TYPE_INT32 or TYPE_FP32{suffix}")
        for src in bi.source_input:
            if src not in inputs:
                raise _invalid(f"unknown source input name '{src}'{suffix}")
    for bo in cfg.batch_output:
        if len(bo.source_input) != 1:
            raise _invalid(
                f"batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, "
                f"got {len(bo.source_input)}{suffix}"
            )
        for src in bo.source_input:
            if src not in inputs:
                raise _invalid(f"unknown source input name '{src}'{suffix}")
        targets: set[str] = set()
        for target in bo.target_name:
            if target not in outputs:
                raise _invalid(f"unknown target output name '{target}'{suffix}")
            if target in targets:
                raise _invalid(f"target output name '{target}' can only be specified once{suffix}")
            targets.add(target)
