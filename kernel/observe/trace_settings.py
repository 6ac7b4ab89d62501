"""Trace settings: levels, the start-up settings from the command line (--trace-config and
the older --trace-* flags), updates from the trace extension and the parsing of their values with
tritonserver's rules and messages, and the extension's read/update operations on a server.

The tracer that applies them to requests is kernel.observe.trace.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any, Optional

from kernel.core.errors import ErrorCode, KernelError

log = logging.getLogger("kernel.observe.trace")

MIN_COUNT = -1
UINT32_MAX = 2**32 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
TRACE_MODES = ("triton", "opentelemetry")
# The batch span processor's settings (--trace-config opentelemetry,<name>=<n>), in the order
# tritonserver lists those not given after those given.
BSP_SETTINGS = ("bsp_max_export_batch_size", "bsp_schedule_delay", "bsp_max_queue_size")


class TraceLevel(enum.IntFlag):
    OFF = 0
    TIMESTAMPS = 4
    TENSORS = 8


def level_names(level: TraceLevel) -> list[str]:
    if not level:
        return ["OFF"]
    return [name for name, flag in (("TIMESTAMPS", TraceLevel.TIMESTAMPS), ("TENSORS", TraceLevel.TENSORS))
            if level & flag]


@dataclass(frozen=True)
class TraceConfig:
    """Start-up trace settings (--trace-config, or the old --trace-* flags)."""

    level: TraceLevel = TraceLevel.OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    # --trace-config opentelemetry,<setting>=<value> in the order given (url, resource, bsp_*, and
    # any other name, which tritonserver keeps and shows too); bsp_* values already parsed.
    otel: tuple[tuple[str, str], ...] = ()


class _Clear:
    """Marks a setting to clear: it follows the global setting (or the start-up value) again."""

    def __repr__(self) -> str:
        return "CLEAR"


CLEAR: Any = _Clear()


@dataclass
class TraceUpdate:
    """A trace-setting request: each field is None (leave it), CLEAR, or the new value."""

    level: Any = None
    rate: Any = None
    count: Any = None
    log_frequency: Any = None


SETTING_FIELDS = ("level", "rate", "count", "log_frequency")


# ---------------------------------------------------------------- start-up settings (command line)


class TraceConfigError(ValueError):
    """A --trace-config (or --trace-*) value tritonserver would refuse."""


def _cli_level(value: str) -> TraceLevel:
    v = value.lower()
    if v in ("false", "off"):
        return TraceLevel.OFF
    if v in ("true", "on", "min", "max", "timestamps"):
        return TraceLevel.TIMESTAMPS
    if v == "tensors":
        return TraceLevel.TENSORS
    raise TraceConfigError(f"invalid value for trace level option: {value}")


def _cli_int(value: str, low: int, what: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise TraceConfigError(f"Invalid option value. Got {value}") from None
    if number < low:
        raise TraceConfigError(f"{what} must be >= {low}, got {value}")
    return number


def config_from_flags(trace_config: list[str], file: Optional[str] = None, levels: Optional[list[str]] = None,
                      rate: Optional[str] = None, count: Optional[str] = None,
                      log_frequency: Optional[str] = None) -> TraceConfig:
    """tritonserver's trace flags: `--trace-config [<mode>,]<setting>=<value>` (repeatable) and the
    deprecated --trace-file/--trace-level/--trace-rate/--trace-count/--trace-log-frequency, which
    --trace-config overrides. A level of OFF anywhere disables tracing."""
    groups: dict[str, list[tuple[str, str]]] = {}  # mode ("" = global) -> (setting, value), in order
    for item in trace_config:
        comma = item.find(",")
        equals = item.find("=", comma + 1)
        if comma == 0:
            raise TraceConfigError(
                "No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> "
                f"or <setting>=<value>. Got {item}"
            )
        mode = ""
        if comma > 0:
            mode = item[:comma].lower()
            if mode not in ("triton", "opentelemetry"):
                raise TraceConfigError(
                    f'invalid value for trace mode option: {item[:comma]}. Available options are "triton" and '
                    '"opentelemetry"'
                )
        setting, value = item[comma + 1:equals], item[equals + 1:]
        if equals < 0 or not setting or not value:
            raise TraceConfigError(
                f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {item}"
            )
        groups.setdefault(mode, []).append((setting, value))
    level = TraceLevel.OFF
    disabled = False
    for name in levels or ():
        parsed = _cli_level(name)
        disabled |= not parsed
        level |= parsed
    values = {"rate": rate, "count": count, "file": file, "log-frequency": log_frequency}
    general = groups.get("", [])
    mode = "triton"
    for setting, value in general:
        try:
            if setting == "level":
                parsed = _cli_level(value)
                disabled |= not parsed
                level |= parsed
            elif setting in ("rate", "count"):
                values[setting] = value
            elif setting == "mode":
                mode = value.lower()
                if mode not in ("triton", "opentelemetry"):
                    raise TraceConfigError(
                        f'invalid value for trace mode option: {value}. '
                        'Available options are "triton" and "opentelemetry"'
                    )
        except TraceConfigError as exc:
            raise TraceConfigError(f'Bad option: "--trace-config {setting}". {exc}') from None
    otel: list[tuple[str, str]] = []
    if mode == "opentelemetry":
        # tritonserver ignores the Triton-mode file settings in this mode, warning about the old flags.
        if file is not None:
            log.warning("'--trace-file' is deprecated and will be ignored with opentelemetry tracing mode.")
        if log_frequency is not None:
            log.warning("'--trace-log-frequency' is deprecated and will be ignored with opentelemetry tracing mode.")
        for setting, value in groups.get("opentelemetry", []):
            if setting in BSP_SETTINGS:
                try:
                    value = str(_cli_uint32(value))
                except TraceConfigError as exc:
                    raise TraceConfigError(f'Bad option: "--trace-config opentelemetry,{setting}".\n{exc}') from None
            otel.append((setting, value))
    else:
        for setting, value in groups.get("triton", []):
            if setting in ("file", "log-frequency"):
                values[setting] = value
    return TraceConfig(
        level=TraceLevel.OFF if disabled else level,
        rate=_cli_int(values["rate"], 0, "trace rate") if values["rate"] is not None else 1000,
        count=_cli_int(values["count"], MIN_COUNT, "trace count") if values["count"] is not None else -1,
        log_frequency=(_cli_int(values["log-frequency"], 0, "trace log frequency")
                       if values["log-frequency"] is not None and mode == "triton" else 0),
        file=(values["file"] or "") if mode == "triton" else "",
        mode=mode,
        otel=tuple(otel),
    )


def _cli_uint32(value: str) -> int:
    """A batch span processor number as tritonserver reads it: an integer, a negative one wrapping to uint32."""
    try:
        return int(value.strip()) & UINT32_MAX
    except ValueError:
        raise TraceConfigError(f"Invalid option value. Got {value}") from None


# ---------------------------------------------------------------- parsing request values


def invalid_setting(message: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, message)


class _NotANumber(ValueError):
    pass


class _OutOfRange(ValueError):
    pass


def stoi(text: str) -> int:
    """C++ std::stoi: leading blanks, a sign, digits; what follows the digits is ignored."""
    i, n = 0, len(text)
    while i < n and text[i] in " \t\n\v\f\r":
        i += 1
    start = i
    if i < n and text[i] in "+-":
        i += 1
    digits = i
    while i < n and "0" <= text[i] <= "9":
        i += 1
    if i == digits:
        raise _NotANumber(text)
    value = int(text[start:i])
    if not INT32_MIN <= value <= INT32_MAX:
        raise _OutOfRange(text)
    return value


def parse_unsigned(name: str, text: str) -> int:
    """trace_rate / log_frequency: parsed as tritonserver does (a negative value wraps to uint32)."""
    try:
        return stoi(text) & UINT32_MAX
    except _NotANumber:
        raise invalid_setting(f"Unable to parse '{name}', got: {text}") from None
    except _OutOfRange:
        raise invalid_setting(
            f"Unable to parse '{name}', value is out of range [ 0, {UINT32_MAX} ], got: {text}"
        ) from None


def parse_count(text: str, grpc: bool = False) -> int:
    try:
        count = stoi(text)
    except _NotANumber:
        raise invalid_setting(f"Unable to parse 'trace_count', got: {text}") from None
    except _OutOfRange:
        raise invalid_setting(
            f"Unable to parse 'trace_count', value is out of range [ {MIN_COUNT}, {INT32_MAX} ], got: {text}"
        ) from None
    if count < MIN_COUNT:
        space = " " if grpc else ""  # the two endpoints word it differently
        raise invalid_setting(f"Unable to parse 'trace_count'. Expecting value >= {MIN_COUNT}, got:{space}{text}")
    return count


def parse_levels(names: list[str]) -> Optional[TraceLevel]:
    """A trace_level list; None when it names no known level (the setting is left alone)."""
    level: Optional[TraceLevel] = None
    for name in names:
        if name == "OFF":
            if len(names) != 1:
                raise invalid_setting("Expect only one trace level 'OFF' is specified")
            level = TraceLevel.OFF
        elif name == "TIMESTAMPS":
            level = (level or TraceLevel.OFF) | TraceLevel.TIMESTAMPS
        elif name == "TENSORS":
            level = (level or TraceLevel.OFF) | TraceLevel.TENSORS
    return level


# ---------------------------------------------------------------- the extension's operations


def check_model(server, model_name: str) -> None:
    """A per-model setting needs a loaded model (Triton's message otherwise)."""
    if model_name:
        entry = server.registry.entries.get(model_name)
        if entry is None or entry.latest_ready() is None:
            raise KernelError(ErrorCode.INVALID_ARG, f"Request for unknown model : {model_name}")


def describe(server, model_name: str = "") -> dict:
    """The trace extension's settings for a model ('' = global); raises for unknown models."""
    check_model(server, model_name)
    return server.tracer.describe(model_name)


def update(server, model_name: str, change: "TraceUpdate") -> dict:
    check_model(server, model_name)
    server.tracer.update(model_name, change)
    return server.tracer.describe(model_name)


async def change(server, model_name: str, change: "TraceUpdate") -> dict:
    """update for the whole server: with several front processes every front takes the change
    before this returns (kernel.core.peers)."""
    check_model(server, model_name)
    if getattr(server, "peers", None) is not None:
        await server.peers.change_trace_settings(model_name, change)
        return server.tracer.describe(model_name)
    return update(server, model_name, change)



def settings_json(doc: dict) -> bytes:
    """A `$trace_setting_response` as tritonserver's HTTP endpoint writes it: a setting given more than
    once (opentelemetry,resource=...) appears once per value, as repeated keys."""
    import msgspec

    encode = msgspec.json.encode
    parts = []
    for key, value in doc.items():
        if key != "trace_level" and isinstance(value, list):
            parts.extend(encode(key) + b":" + encode(v) for v in value)
        else:
            parts.append(encode(key) + b":" + encode(value))
    return b"{" + b",".join(parts) + b"}"
