"""Worker processes outlive the stop signals a whole process group gets.

Ctrl-C in a terminal reaches every process of its group, and so does the SIGTERM that systemd
(KillMode=control-group), `timeout`, or a container runtime's stop sends to a group: the front
process would then drain in-flight requests while the workers running them had died under it
(the requests failing with "not healthy", restarts tried during shutdown). The front decides
when a worker stops (a Shutdown message, a SIGKILL at the exit timeout), and a worker also ends
when the front's channel closes, so a worker has nothing to do on SIGINT or SIGTERM.

A handler that does nothing, not SIG_IGN: an ignored signal stays ignored across exec, so a
model's own subprocesses would inherit it; a handler is reset to the default in them.
"""

from __future__ import annotations

import signal


def _ignore(signum, frame) -> None:
    pass


def hold_stop_signals() -> None:
    """In a worker (or standby) process: SIGINT and SIGTERM change nothing here."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _ignore)
