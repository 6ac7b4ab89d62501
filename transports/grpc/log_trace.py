"""The LogSettings and TraceSetting RPCs (logging and trace extensions) over the core.

Messages and status codes follow tritonserver's gRPC endpoint, whose wording
differs in places from its HTTP endpoint (transports/http/log_trace.py).
"""

from __future__ import annotations

from kernel.core.errors import ErrorCode, KernelError
from kernel.observe.log import LOG_FORMATS
from kernel.observe import log as server_log
from kernel.observe import trace_settings
from kernel.observe.trace_settings import CLEAR, TraceUpdate, parse_count, parse_levels, parse_unsigned
from kernel.transports.grpc.protos import grpc_service_pb2 as pb


async def log_settings(server, msg) -> pb.LogSettingsResponse:
    settings = msg.settings
    if settings:
        changes: dict = {}
        try:
            _log_changes(settings, changes)
        finally:
            await server_log.change_settings(server, **changes)  # those before a bad value still apply, as in tritonserver
    s = server.log_settings
    reply = pb.LogSettingsResponse()
    out = reply.settings
    out["log_file"].string_param = s.file
    out["log_info"].bool_param = s.info
    out["log_warning"].bool_param = s.warning
    out["log_error"].bool_param = s.error
    out["log_verbose_level"].uint32_param = s.verbose
    out["log_format"].string_param = s.format
    return reply


def _expect(kind: str, name: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, f"expect {kind} for '{name}'")


def _log_changes(settings, changes: dict) -> None:
    if "log_file" in settings:
        raise KernelError(ErrorCode.UNSUPPORTED, "log file location can not be updated through network protocol")
    for key, field in (("log_info", "info"), ("log_warning", "warning"), ("log_error", "error")):
        if key in settings:
            value = settings[key]
            if value.WhichOneof("parameter_choice") != "bool_param":
                raise _expect("boolean", key)
            changes[field] = value.bool_param
    if "log_verbose_level" in settings:
        value = settings["log_verbose_level"]
        if value.WhichOneof("parameter_choice") != "uint32_param":
            raise _expect("int32", "log_verbose_level")
        changes["verbose"] = value.uint32_param
    if "log_format" in settings:
        value = settings["log_format"]
        if value.WhichOneof("parameter_choice") != "string_param":
            raise _expect("string", "log_format")
        if value.string_param not in LOG_FORMATS:
            raise KernelError(ErrorCode.INVALID_ARG, f"invalid argument for log_format, got: {value.string_param}")
        changes["format"] = value.string_param


async def trace_setting(server, msg) -> pb.TraceSettingResponse:
    model_name = msg.model_name
    trace_settings.check_model(server, model_name)
    if msg.settings:
        await trace_settings.change(server, model_name, _trace_update(msg.settings))
    reply = pb.TraceSettingResponse()
    for key, value in trace_settings.describe(server, model_name).items():
        reply.settings[key].value.extend(value if isinstance(value, list) else [value])
    return reply


def _trace_update(settings) -> TraceUpdate:
    """Each setting carries a list of values; an empty list clears the setting."""
    if "trace_file" in settings:
        raise KernelError(ErrorCode.UNSUPPORTED, "trace file location can not be updated through network protocol")
    update = TraceUpdate()
    if "trace_level" in settings:
        levels = list(settings["trace_level"].value)
        update.level = parse_levels(levels) if levels else CLEAR
    for key, field in (("trace_rate", "rate"), ("trace_count", "count"), ("log_frequency", "log_frequency")):
        if key not in settings:
            continue
        values = settings[key].value
        if not values:
            setattr(update, field, CLEAR)
        elif len(values) > 1:
            raise KernelError(ErrorCode.INVALID_ARG, f"expect only 1 value for '{key}'")
        else:
            text = values[0]
            setattr(update, field, parse_count(text, grpc=True) if key == "trace_count" else parse_unsigned(key, text))
    return update
