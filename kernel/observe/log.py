"""Server log lines in tritonserver's layout, so existing log greps keep working.

    I1121 08:07:00.123456 4242 model_lifecycle.py:120] "successfully loaded 'add_sub'"

Level letter (I/W/E; verbose lines are I too, as in tritonserver), month+day, wall-clock time with microseconds, process
id, source file:line, then the message in double quotes.

Besides tritonserver's two layouts ("default" above, and "ISO8601"), `--log-format json` writes
the same fields as one JSON object per line, for log collectors that parse JSON, plus the event's
structure as fields of their own (EVENT_FIELDS: model, version, state, reason for load events;
service and address for listeners), and the model table as one object per model:

    {"time": "2026-11-21T08:07:00.123456Z", "level": "INFO", "pid": 4242, "file": "loader.py",
     "line": 72, "message": "successfully loaded 'add_sub'", "model": "add_sub", "state": "READY"}

Kernel's records are ordinary `logging` records under the `kernel.*` loggers, propagating to the
root logger. Where Kernel owns the process (`kernel serve`, a model worker) its handler sits on the
root logger and formats every record, Kernel's and its libraries'. Inside an application
(kernel.triton's in-process server) Kernel's handler writes only while the application has no
handler of its own on the root logger: once it has (`logging.basicConfig(...)`), Kernel's records
are the application's to route, filter and format, with the structure above as record attributes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass

# Verbose lines carry "I", as tritonserver's do (--log-verbose=1: "I... cache_manager.cc:480] ...").
_LETTERS = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "E"}


class TritonFormatter(logging.Formatter):
    def __init__(self, iso8601: bool = False):
        super().__init__()
        self.iso8601 = iso8601

    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTERS.get(record.levelno, "I")
        secs = record.created
        micros = int((secs - int(secs)) * 1_000_000)
        if self.iso8601:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(secs))
            head = f"{stamp} {letter}"
        else:
            # UTC, whatever TZ says, as tritonserver's own lines (and pb_utils.Logger's) are.
            stamp = time.strftime("%m%d %H:%M:%S", time.gmtime(secs))
            head = f"{letter}{stamp}.{micros:06d}"
        message = record.getMessage()
        if record.exc_info:
            message = message + "\n" + self.formatException(record.exc_info)
        if "\n" in message:
            # Multi-line text (tables, tracebacks) is printed as-is after the header.
            return f"{head} {os.getpid()} {record.filename}:{record.lineno}] \n{message}"
        escaped = message.replace("\\", "\\\\").replace('"', '\\"')
        return f'{head} {os.getpid()} {record.filename}:{record.lineno}] "{escaped}"'


LOG_LEVEL_NAMES = {logging.DEBUG: "VERBOSE", logging.INFO: "INFO", logging.WARNING: "WARNING",
                   logging.ERROR: "ERROR", logging.CRITICAL: "ERROR"}


def json_log_line(level: str, created: float, pid: int, file: str, line: int, message: str,
                  fields: dict | None = None) -> str:
    """One log line as a JSON object (`--log-format json`): the text layout's fields, by name, then
    the event's own `fields`. `time` is UTC with microseconds; `level` is INFO, WARNING, ERROR or VERBOSE."""
    micros = int((created - int(created)) * 1_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{micros:06d}Z"
    doc = {"time": stamp, "level": level, "pid": pid, "file": file, "line": line, "message": message}
    if fields:
        doc.update((k, v) for k, v in fields.items() if k not in doc)
    return json.dumps(doc, ensure_ascii=False, default=str)


# Structure a record may carry (logging's `extra=`), written by the JSON layout as fields of their own.
EVENT_FIELDS = ("model", "version", "state", "reason", "service", "address")


def model_event(model: str, state: str, version: int | None = None, reason: str = "") -> dict:
    """`extra=` for a load event: the model, its version (when the event is a version's), its state
    as the repository index names it, and why (for UNAVAILABLE)."""
    event: dict = {"model": model, "state": state}
    if version is not None:
        event["version"] = version
    if reason:
        event["reason"] = reason
    return event


class JsonFormatter(logging.Formatter):
    """`--log-format json`: one JSON object per record, multi-line messages (tracebacks) included, so
    that every line of the log parses by itself. A record's EVENT_FIELDS are fields of their own; the
    model table (a record with `models`, one event per row) is one object per model."""

    def format(self, record: logging.LogRecord) -> str:
        level = LOG_LEVEL_NAMES.get(record.levelno, "INFO")
        pid = os.getpid()
        models = getattr(record, "models", None)
        if models is not None:  # the model table: one event per model, not one 900-character text
            return "\n".join(
                json_log_line(level, record.created, pid, record.filename, record.lineno, _row_message(row), row)
                for row in models
            ) if models else json_log_line(level, record.created, pid, record.filename, record.lineno, "no models")
        message = record.getMessage()
        if record.exc_info:
            message = message + "\n" + self.formatException(record.exc_info)
        fields = {k: getattr(record, k) for k in EVENT_FIELDS if hasattr(record, k)}
        return json_log_line(level, record.created, pid, record.filename, record.lineno, message, fields)


def _row_message(row: dict) -> str:
    version = f" version {row['version']}" if "version" in row else ""
    reason = f": {row['reason']}" if row.get("reason") else ""
    return f"model '{row['model']}'{version} is {row['state']}{reason}"


LOG_FORMATS = ("default", "ISO8601", "json")


def formatter_for(log_format: str) -> logging.Formatter:
    """The formatter of one of LOG_FORMATS."""
    if log_format == "json":
        return JsonFormatter()
    return TritonFormatter(iso8601=(log_format == "ISO8601"))


@dataclass(frozen=True)
class LogSettings:
    """The server's log settings, as the logging extension (GET/POST /v2/logging) names them."""

    file: str = ""  # "" = stderr
    info: bool = True
    warning: bool = True
    error: bool = True
    verbose: int = 0  # verbose messages of level <= this are written; 0 = none
    format: str = "default"  # one of LOG_FORMATS


class _LevelGate(logging.Filter):
    """Each of info, warning, error and verbose is switched on or off by itself, as in Triton."""

    def __init__(self, settings: LogSettings):
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        s = self.settings
        level = record.levelno
        if level < logging.INFO:
            return s.verbose > 0
        if level < logging.WARNING:
            return s.info
        if level < logging.ERROR:
            return s.warning
        return s.error


class _NoApplicationHandler(logging.Filter):
    """Inside an application: Kernel's handler writes only while the application's root logger has no
    handler; from the moment it has one, the application's handlers take Kernel's records instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.root.handlers


_gate: _LevelGate | None = None
_handler: logging.Handler | None = None


# Where Kernel's handler goes (install's `role`).
SERVE = "serve"  # `kernel serve`'s front: Kernel's process, its handler on the root logger
EMBEDDED = "embedded"  # inside an application (kernel.triton): the application's logging decides
WORKER = "worker"  # a model's process: the root logger is the model's (its basicConfig must work)
ROLES = (SERVE, EMBEDDED, WORKER)


def configure(verbose: int = 0, log_info: bool = True, log_warning: bool = True, log_error: bool = True,
              log_format: str = "default", log_file: str | None = None, role: str = SERVE) -> None:
    """Write the log to stderr (or a file) in Triton's format; see install() for `role`."""
    install(LogSettings(log_file or "", log_info, log_warning, log_error, verbose, log_format), role)


def install(settings: LogSettings, role: str = WORKER) -> None:
    """Give the log one handler of Kernel's (stderr, or the log file, appended to) in Triton's format.

    SERVE: the handler goes on the root logger and formats every record, Kernel's and its libraries'.
    EMBEDDED: it goes on the `kernel` logger and writes only while the application has configured no
    root handler; Kernel's records propagate to the application's logging either way. WORKER: on
    the `kernel` logger, not propagated: the model's own logging setup (its root logger) is left to it.
    """
    global _gate, _handler
    if role not in ROLES:
        raise ValueError(f"unknown log role {role!r}")
    handler: logging.Handler = (
        logging.FileHandler(settings.file) if settings.file else logging.StreamHandler(sys.stderr)
    )
    _gate = _LevelGate(settings)
    handler.addFilter(_gate)
    if role == EMBEDDED:
        handler.addFilter(_NoApplicationHandler())
    previous, _handler = _handler, handler
    kernel = logging.getLogger("kernel")
    for logger in (logging.root, kernel):
        if previous is not None and previous in logger.handlers:
            logger.removeHandler(previous)
            previous.close()
    (logging.root if role == SERVE else kernel).addHandler(handler)
    kernel.propagate = role != WORKER
    apply(settings)


def _lowest_level(settings: LogSettings) -> int:
    """The lowest level any switch lets through: records below it are not even built. Kernel's own
    handler also applies each switch by itself (info off with warnings on, as Triton allows)."""
    if settings.verbose > 0:
        return logging.DEBUG
    for enabled, level in ((settings.info, logging.INFO), (settings.warning, logging.WARNING),
                           (settings.error, logging.ERROR)):
        if enabled:
            return level
    return logging.CRITICAL + 1


def apply(settings: LogSettings) -> None:
    """Take new settings at run time (the log file stays the one install() opened)."""
    if _gate is not None:
        _gate.settings = settings
    if _handler is not None:
        _handler.setFormatter(formatter_for(settings.format))
    logging.getLogger("kernel").setLevel(_lowest_level(settings))


async def change_settings(server, **changes) -> LogSettings:
    """update_settings for the whole server: with several front processes every front (and, through
    the supervisor, every model worker) takes the changes before this returns."""
    if changes and getattr(server, "peers", None) is not None:
        await server.peers.change_log_settings(changes)
        return server.log_settings
    return update_settings(server, **changes)


def update_settings(server, **changes) -> LogSettings:
    """The logging extension: change settings (LogSettings field names) at run time, in this
    process and in every model instance of every backend."""
    if not changes:
        return server.log_settings
    settings = server.log_settings = dataclasses.replace(server.log_settings, **changes)
    apply(settings)
    for backend in list(server.backends.values()):
        backend.update_log_settings(settings)
    return settings
