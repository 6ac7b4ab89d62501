"""Standby clones: one standby does the worker imports, the others are forked from it.

Why: on two cores, four standbys importing numpy, asyncio, uvloop and msgspec side by side cost
four times ~0.1 s of CPU while the front imports the server on the same cores. Forked from one
standby that has done them, the others cost a fork each (a few ms) and share its pages until they
write them (PSS drops; RSS, which counts shared pages in every process, stays about the same).

A clone must still be a child of the front, as every worker is (the front waits for its exit
status, tests and operators find workers among the front's children). The front is therefore a
child subreaper while the clones are made (`become_subreaper`): the template forks an intermediate
process, which forks the clone and exits, so the clone is re-parented to the front; the template
reports the clone's pid only after the intermediate is gone. The front watches an adopted clone
through a pidfd (`AdoptedProcess`), as asyncio watches the processes it started itself.

Nothing else of a worker changes: the clone waits for its assignment and runs worker.main exactly
as a standby started on its own would. numpy.random and random are not imported by the template,
so no random state is shared between clones (Python's own `random` reseeds at fork regardless).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper(on: bool = True) -> bool:
    """Make the front (or stop it being) the reaper of its orphaned descendants; False where Linux
    or this Python cannot, and the standbys are then started one process each."""
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        return False
    try:
        if on:  # Linux 5.3+: AdoptedProcess needs pidfds
            os.close(os.pidfd_open(os.getpid()))
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class AdoptedProcess:
    """A clone the front adopted, with the part of asyncio.subprocess.Process that instances use:
    pid, returncode, wait(), send_signal(), terminate(), kill()."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode = None
        self._loop = asyncio.get_running_loop()
        self._exited = self._loop.create_future()
        self._fd = os.pidfd_open(pid)
        self._loop.add_reader(self._fd, self._reap)

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # not ours after all (released before it was re-parented): init reaps it
            pid, status = self.pid, -1
        if pid == 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self.returncode = os.waitstatus_to_exitcode(status) if status != -1 else 255
        if not self._exited.done():
            self._exited.set_result(self.returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        signal.pidfd_send_signal(self._fd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def make_clones(spec: str, report_fd: int, keep: tuple[int, ...], run) -> None:
    """In the template standby, imports done: fork one clone per `spec` group ("assign,channel,fd"
    fds, ';'-separated) and write "<index> <pid>" lines to `report_fd`. A clone closes every fd
    that is not its own, then calls run(assign_fd, channel_args) and exits; the template keeps
    `keep` (its own fds) and closes the clones'."""
    groups = [tuple(int(x) for x in g.split(",")) for g in spec.split(";") if g]
    for i, own in enumerate(groups):
        sys.stdout.flush()
        sys.stderr.flush()
        read_pid, write_pid = os.pipe()
        middle = _fork()
        if middle == 0:  # the intermediate: fork the clone, tell the template its pid, go
            code = 0
            try:
                clone = _fork()
                if clone == 0:
                    _become_clone(own, [report_fd, read_pid, write_pid, *keep, *(fd for g in groups if g is not own for fd in g)], run)
                os.write(write_pid, str(clone).encode())
            except BaseException:  # noqa: BLE001 - never back into the template's code
                code = 1
            os._exit(code)
        os.close(write_pid)
        os.waitpid(middle, 0)  # gone: the clone is the front's child now
        pid = os.read(read_pid, 32)
        os.close(read_pid)
        if pid:
            os.write(report_fd, f"{i} {int(pid)}\n".encode())
        for fd in own:
            os.close(fd)
    os.close(report_fd)


def _fork() -> int:
    import warnings

    # Python 3.12+ warns about fork() in a process with threads; the template's only threads are
    # OpenBLAS's (numpy), which OpenBLAS's own pthread_atfork handlers stop and restart around it.
    # Only these forks: a model's own fork() still warns.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks", category=DeprecationWarning)
        return os.fork()


def _become_clone(own: tuple[int, ...], others: list[int], run) -> None:
    """The clone: keep its own fds only, run as a standby, never return."""
    code = 0
    try:
        for fd in others:
            try:
                os.close(fd)
            except OSError:
                pass
        assign_fd, channel, fd_channel = own
        run(assign_fd, ["--channel-fd", str(channel), "--fd-channel-fd", str(fd_channel)])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends a process
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
