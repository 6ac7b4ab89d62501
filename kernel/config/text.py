"""config.pbtxt text and JSON: parse (text format, JSON, dicts) and render the JSON Triton serves.

The JSON rendering must equal what Triton serves in content, since models parse it in
`initialize` and clients read it from `/v2/models/<m>/config`.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from kernel.protos.model_config_pb2 import (
    ModelConfig,
)

from kernel.config.constants import invalid


# --------------------------------------------------------------------------- parsing


def parse_config_text(text: str, source: str) -> ModelConfig:
    """Parse config.pbtxt text; `source` (usually the file path) is named in errors."""
    cfg = ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise invalid(f"failed to read text proto from {source}: {exc}") from None
    return cfg


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from Triton-style JSON data (as from config_to_dict).

    64-bit fields may be ints or strings. Enum names are matched
    case-insensitively, as Triton's own JSON reader does for config overrides.
    """
    if not isinstance(d, dict):
        raise invalid(f"model configuration must be a JSON object, got {type(d).__name__}")
    cfg = ModelConfig()
    try:
        json_format.ParseDict(_upper_enums(d, ModelConfig.DESCRIPTOR), cfg, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise invalid(f"failed to parse model configuration: {exc}") from None
    return cfg


def config_from_json(text: str | bytes) -> ModelConfig:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise invalid(f"model configuration is not valid JSON: {exc}") from None
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
