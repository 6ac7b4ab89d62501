"""HTTP routes of the logging and trace extensions.

    GET|POST /v2/logging
    GET|POST /v2/trace/setting
    GET|POST /v2/models/<model>[/versions/<v>]/trace/setting

Request values are checked the way tritonserver's JSON reader checks them, so
clients see the same status codes and messages (a value of the wrong JSON
type is a 500 "attempt to access JSON non-... as ..."). Log settings apply one
by one in a fixed order, so those before a bad one still take effect, as in
tritonserver; a trace setting request applies all or nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kernel.core.errors import ErrorCode, KernelError
from kernel.observe.log import LOG_FORMATS
from kernel.observe import log as server_log
from kernel.observe import trace_settings
from kernel.observe.trace_settings import CLEAR, TraceUpdate, parse_count, parse_levels, parse_unsigned
from kernel.transports.asgi import JSON_HEADERS, send_error, send_json, send_response

LOGGING_PATH = "/v2/logging"
TRACE_PATH = "/v2/trace/setting"

_decode = msgspec.json.Decoder().decode


def _json_type_error(expected: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, f"attempt to access JSON non-{expected} as {expected}")


async def _request_doc(app, receive) -> Any:
    body = await app.read_control_body(receive)
    if body is None:
        return None
    try:
        doc = _decode(body)
    except msgspec.DecodeError as exc:
        raise KernelError(ErrorCode.INVALID_ARG, f"failed to parse the request JSON buffer: {exc}") from None
    return doc if isinstance(doc, dict) else {}  # a JSON value other than an object sets nothing


async def handle_logging(app, method: str, receive, send) -> None:
    if method not in ("GET", "POST"):
        await send_error(send, 405, "Method Not Allowed")
        return
    server = app.server
    if method == "POST":
        doc = await _request_doc(app, receive)
        if doc is None:
            return  # the client went away
        changes: dict = {}
        try:
            _log_changes(doc, changes)
        finally:
            await server_log.change_settings(server, **changes)  # those before a bad value still apply
    s = server.log_settings
    await send_json(send, 200, {
        "log_file": s.file, "log_info": s.info, "log_warning": s.warning, "log_error": s.error,
        "log_verbose_level": s.verbose, "log_format": s.format,
    })


def _log_changes(doc: dict, changes: dict) -> None:
    """Read a `$log_setting_request` into `changes` (LogSettings fields), stopping at the first bad value."""
    if doc.get("log_file") is not None:
        raise KernelError(ErrorCode.UNSUPPORTED, "log file location can not be updated through network protocol")
    for key, field in (("log_info", "info"), ("log_warning", "warning"), ("log_error", "error")):
        value = doc.get(key)
        if value is not None:
            if not isinstance(value, bool):
                raise _json_type_error("boolean")
            changes[field] = value
    value = doc.get("log_verbose_level")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
            raise _json_type_error("unsigned-integer")
        changes["verbose"] = value & 0xFFFFFFFF
    value = doc.get("log_format")
    if value is not None:
        if not isinstance(value, str):
            raise _json_type_error("string")
        if value not in LOG_FORMATS:
            raise KernelError(ErrorCode.UNAVAILABLE, f"invalid argument for --log_format, got: {value}")
        changes["format"] = value


async def handle_trace(app, model_name: str, method: str, receive, send) -> None:
    if method not in ("GET", "POST"):
        await send_error(send, 405, "Method Not Allowed")
        return
    server = app.server
    trace_settings.check_model(server, model_name)
    if method == "POST":
        doc = await _request_doc(app, receive)
        if doc is None:
            return
        await trace_settings.change(server, model_name, _trace_update(doc))
    await send_response(send, 200, JSON_HEADERS, trace_settings.settings_json(trace_settings.describe(server, model_name)))


def _trace_update(doc: dict) -> TraceUpdate:
    """A `$trace_setting_request` as a TraceUpdate (JSON null clears a setting)."""
    if "trace_file" in doc:
        raise KernelError(ErrorCode.UNSUPPORTED, "trace file location can not be updated through network protocol")
    update = TraceUpdate()
    if "trace_level" in doc:
        levels = doc["trace_level"]
        if levels is None:
            update.level = CLEAR
        else:
            if not isinstance(levels, list):
                raise _json_type_error("array")
            if not all(isinstance(v, str) for v in levels):
                raise _json_type_error("string")
            update.level = parse_levels(levels)
    for key, field in (("trace_rate", "rate"), ("trace_count", "count"), ("log_frequency", "log_frequency")):
        if key not in doc:
            continue
        value = doc[key]
        if value is None:
            setattr(update, field, CLEAR)
            continue
        if not isinstance(value, str):
            raise _json_type_error("string")
        setattr(update, field, parse_count(value) if key == "trace_count" else parse_unsigned(key, value))
    return update
