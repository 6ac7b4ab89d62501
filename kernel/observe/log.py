"""Server log lines in tritonserver's layout, so existing log greps keep working.

    I1121 08:07:00.123456 4242 model_lifecycle.py:120] "successfully loaded 'add_sub'"

Level letter (I/W/E; verbose lines are I too, as in tritonserver), month+day, wall-clock time with microseconds, process
id, source file:line, then the message in double quotes.

Besides tritonserver's two layouts ("default" above, and "ISO8601"), `--log-format json` writes
the same fields as one JSON object per line, for log collectors that parse JSON:

    {"time": "2026-11-21T08:07:00.123456Z", "level": "INFO", "pid": 4242,
     "file": "model_lifecycle.py", "line": 120, "message": "successfully loaded 'add_sub'"}
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


def json_log_line(level: str, created: float, pid: int, file: str, line: int, message: str) -> str:
    """One log line as a JSON object (`--log-format json`): the text layout's fields, by name.
    `time` is UTC with microseconds; `level` is INFO, WARNING, ERROR or VERBOSE."""
    micros = int((created - int(created)) * 1_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{micros:06d}Z"
    return json.dumps({"time": stamp, "level": level, "pid": pid, "file": file, "line": line, "message": message},
                      ensure_ascii=False)


class JsonFormatter(logging.Formatter):
    """`--log-format json`: one JSON object per record, multi-line messages (tables, tracebacks)
    included, so that every line of the log parses by itself."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message = message + "\n" + self.formatException(record.exc_info)
        level = LOG_LEVEL_NAMES.get(record.levelno, "INFO")
        return json_log_line(level, record.created, os.getpid(), record.filename, record.lineno, message)


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


_gate: _LevelGate | None = None
_handler: logging.Handler | None = None


def configure(verbose: int = 0, log_info: bool = True, log_warning: bool = True, log_error: bool = True,
              log_format: str = "default", log_file: str | None = None) -> None:
    """Route the 'kernel' loggers to stderr (or a file) in Triton's format."""
    install(LogSettings(log_file or "", log_info, log_warning, log_error, verbose, log_format))


def install(settings: LogSettings) -> None:
    """Give the 'kernel' loggers one handler (stderr, or the log file, appended to) in Triton's format."""
    global _gate, _handler
    handler: logging.Handler = (
        logging.FileHandler(settings.file) if settings.file else logging.StreamHandler(sys.stderr)
    )
    _gate = _LevelGate(settings)
    handler.addFilter(_gate)
    _handler = handler
    root = logging.getLogger("kernel")
    root.handlers[:] = [handler]
    root.propagate = False
    apply(settings)


def apply(settings: LogSettings) -> None:
    """Take new settings at run time (the log file stays the one install() opened)."""
    if _gate is not None:
        _gate.settings = settings
    if _handler is not None:
        _handler.setFormatter(formatter_for(settings.format))
    # Verbose records are not even built unless asked for.
    logging.getLogger("kernel").setLevel(logging.DEBUG if settings.verbose > 0 else logging.INFO)


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
