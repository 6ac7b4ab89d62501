"""Server log lines in tritonserver's layout, so existing log greps keep working.

    I1121 08:07:00.123456 4242 model_lifecycle.py:120] "successfully loaded 'add_sub'"

Level letter (I/W/E/V), month+day, wall-clock time with microseconds, process
id, source file:line, then the message in double quotes.
"""

from __future__ import annotations

import logging
import os
import sys
import time

_LETTERS = {logging.DEBUG: "V", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "E"}


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
            stamp = time.strftime("%m%d %H:%M:%S", time.localtime(secs))
            head = f"{letter}{stamp}.{micros:06d}"
        message = record.getMessage()
        if record.exc_info:
            message = message + "\n" + self.formatException(record.exc_info)
        if "\n" in message:
            # Multi-line text (tables, tracebacks) is printed as-is after the header.
            return f"{head} {os.getpid()} {record.filename}:{record.lineno}] \n{message}"
        escaped = message.replace("\\", "\\\\").replace('"', '\\"')
        return f'{head} {os.getpid()} {record.filename}:{record.lineno}] "{escaped}"'


def configure(verbose: int = 0, log_info: bool = True, log_warning: bool = True, log_error: bool = True,
              log_format: str = "default", log_file: str | None = None) -> None:
    """Route the 'kernel' loggers to stderr (or a file) in Triton's format."""
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(TritonFormatter(iso8601=(log_format == "ISO8601")))
    root = logging.getLogger("kernel")
    root.handlers[:] = [handler]
    root.propagate = False
    if verbose > 0:
        level = logging.DEBUG
    elif log_info:
        level = logging.INFO
    elif log_warning:
        level = logging.WARNING
    elif log_error:
        level = logging.ERROR
    else:
        level = logging.CRITICAL + 1
    root.setLevel(level)
