"""How a worker reports: the server's log settings applied to pb_utils.Logger and
the worker's own loggers, and exceptions formatted as Triton's stub prints them."""

from __future__ import annotations

import logging
import os
import traceback

import kernel

import triton_python_backend_utils as pb_utils
from kernel.backends.python import messages
from kernel.observe import log as server_log

log = logging.getLogger("kernel.worker")

# Folders of Kernel's own code (the kernel package, its backends, pb_utils), as filename prefixes.
_OWN_CODE = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (kernel.__file__, os.path.dirname(os.path.abspath(__file__)), pb_utils.__file__)
)


def format_exception(exc: BaseException) -> str:
    """The exception, then its frames innermost first (the stub's "At:" layout).

    Only the model's frames are listed, as in Triton (whose pb_utils is compiled code):
    Kernel's own frames say nothing to the model's author.
    """
    # importlib's frames are left out as an import statement leaves them out (a model.py that does
    # not compile is its SyntaxError alone, as in tritonserver)
    every = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in every if not f.filename.startswith("<frozen importlib")]
    tb = [frame for frame in frames if not frame.filename.startswith(_OWN_CODE)]
    if not tb and len(frames) == len(every):  # raised by Kernel itself for the model: say where
        tb = frames
    where = "".join(f"  {frame.filename}({frame.lineno}): {frame.name}\n" for frame in reversed(tb))
    text = f"{type(exc).__name__}: {exc}"
    return f"{text}\n\nAt:\n{where}" if where else text


_log_files: dict[str, object] = {}  # log file path -> the open file model log lines are appended to
_installed_log_file: list = [None]  # the file server_log.install() last routed the worker's own loggers to


def apply_log_settings(settings: messages.LogSettings) -> None:
    """The server's log settings, for pb_utils.Logger and the worker's own messages alike."""
    sink = False
    if settings.file:
        stream = _log_files.get(settings.file)
        if stream is None:
            try:
                stream = _log_files[settings.file] = open(settings.file, "a", buffering=1)
            except OSError as exc:
                log.error("cannot open log file '%s': %s", settings.file, exc)
        if stream is not None:
            sink = lambda line, stream=stream: stream.write(line + "\n")  # noqa: E731 - one write per line
    pb_utils._configure_logging(
        verbose=settings.verbose, info=settings.info, warning=settings.warning, error=settings.error,
        log_format=settings.format, sink=sink,
    )
    core = server_log.LogSettings(
        settings.file, settings.info, settings.warning, settings.error, settings.verbose, settings.format
    )
    if _installed_log_file[0] != settings.file:
        _installed_log_file[0] = settings.file
        server_log.install(core)
    else:
        server_log.apply(core)
