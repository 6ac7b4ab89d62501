"""pb_utils.Logger: model log lines in the server's log format, with the
caller's file and line; the worker mirrors the server's log settings here."""

from __future__ import annotations

import enum
import json
import os
import sys
import time


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVEL_LETTER = {
    LogLevel.INFO: "I",
    LogLevel.WARNING: "W",
    LogLevel.ERROR: "E",
    LogLevel.VERBOSE: "I",
}

log_settings = {
    "verbose": 0,
    "info": True,
    "warning": True,
    "error": True,
    "format": "default",
    "escape": os.environ.get("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "1") != "0",
    "sink": None,
}


def set_log_verbosity(level):
    """Worker hook: verbose log level (``--log-verbose``); >0 shows
    ``log_verbose`` messages."""
    log_settings["verbose"] = int(level)


def configure_logging(verbose=None, info=None, warning=None, error=None,
                       log_format=None, escape=None, sink=None):
    """Worker hook: mirror the server's log settings.

    ``log_format`` is "default" or "ISO8601"; ``escape`` toggles JSON quoting
    of messages; ``sink`` is a callable receiving each finished line (without
    newline) instead of it being written to stderr (``sink=False`` goes back
    to stderr).  Arguments left as None keep their current value.
    """
    if verbose is not None:
        log_settings["verbose"] = int(verbose)
    for key, value in (("info", info), ("warning", warning), ("error", error),
                       ("escape", escape)):
        if value is not None:
            log_settings[key] = bool(value)
    if log_format is not None:
        if log_format not in ("default", "ISO8601", "json"):
            raise ValueError("log_format must be 'default', 'ISO8601' or 'json'")
        log_settings["format"] = log_format
    if sink is False:
        log_settings["sink"] = None
    elif sink is not None:
        log_settings["sink"] = sink


def _level_enabled(level):
    if level == LogLevel.VERBOSE:
        return log_settings["verbose"] > 0
    if level == LogLevel.WARNING:
        return log_settings["warning"]
    if level == LogLevel.ERROR:
        return log_settings["error"]
    return log_settings["info"]


def _format_log_line(level, filename, lineno, message, now=None):
    if now is None:
        now = time.time()
    seconds = int(now)
    micros = int((now - seconds) * 1_000_000)
    utc = time.gmtime(seconds)
    letter = _LEVEL_LETTER.get(level, "I")
    if log_settings["format"] == "json":
        # Kernel's `--log-format json`: the server's JSON fields (kernel.observe.log.json_log_line),
        # built here because models import this package without Kernel's.
        return json.dumps({
            "time": "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ" % (
                utc.tm_year, utc.tm_mon, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, micros),
            "level": LogLevel(level).name, "pid": os.getpid(), "file": os.path.basename(filename),
            "line": lineno, "message": message,
        }, ensure_ascii=False)
    if log_settings["escape"]:
        message = json.dumps(message, ensure_ascii=False)
    location = "%d %s:%d] %s" % (
        os.getpid(), os.path.basename(filename), lineno, message)
    if log_settings["format"] == "ISO8601":
        return "%04d-%02d-%02dT%02d:%02d:%02dZ %s %s" % (
            utc.tm_year, utc.tm_mon, utc.tm_mday, utc.tm_hour, utc.tm_min,
            utc.tm_sec, letter, location)
    return "%s%02d%02d %02d:%02d:%02d.%06d %s" % (
        letter, utc.tm_mon, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
        micros, location)


def _emit(level, message, depth):
    if not _level_enabled(level):
        return
    frame = sys._getframe(depth + 1)
    line = _format_log_line(level, frame.f_code.co_filename, frame.f_lineno,
                            str(message))
    sink = log_settings["sink"]
    if sink is not None:
        sink(line)
        return
    stream = sys.stderr
    if stream is not None:
        stream.write(line + "\n")
        stream.flush()


class Logger:
    """Writes messages to the server log, tagged with the caller's file and
    line.  All methods are static: ``pb_utils.Logger.log_info("...")``."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message, level=LogLevel.INFO):
        if not isinstance(level, LogLevel):
            # As Triton's binding: the Logger.<LEVEL> constants only, not plain ints.
            raise TypeError("Logger.log(): 'level' must be one of the Logger levels (Logger.INFO, ...), got "
                            + repr(level))
        _emit(level, _message(message, "log"), 1)

    @staticmethod
    def log_info(message):
        _emit(LogLevel.INFO, _message(message, "log_info"), 1)

    @staticmethod
    def log_warn(message):
        _emit(LogLevel.WARNING, _message(message, "log_warn"), 1)

    @staticmethod
    def log_error(message):
        _emit(LogLevel.ERROR, _message(message, "log_error"), 1)

    @staticmethod
    def log_verbose(message):
        _emit(LogLevel.VERBOSE, _message(message, "log_verbose"), 1)


def _message(message, method):
    """A log message as str: Triton's binding takes str (and bytes, decoded), nothing else."""
    if isinstance(message, str):
        return message
    if isinstance(message, bytes):
        return message.decode("utf-8", "replace")
    raise TypeError("Logger." + method + "(): 'message' must be a str, got " + type(message).__name__)
