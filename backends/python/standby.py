"""Standby workers: worker processes started before the front knows which model each will run.

Why: on a small box the start-up of `kernel serve` is two long stretches one after the other — the
front imports the server (numpy, protobuf, the transports: ~0.3 s on one core) and only then starts
one worker per instance, each of which spends ~0.1 s importing numpy, asyncio, uvloop and msgspec
before model.py is even read. `kernel serve` instead starts, as its very first step, one standby
per instance it expects to start (`estimate`): a plain worker interpreter that does those imports
at once, in parallel with the front, then blocks until the front tells it which model to run.
`WorkerInstance.start` takes a standby when one is left whose interpreter and environment are the
ones it would have started itself (`take`); otherwise it starts a worker as before. Standbys nobody
took are let go once start-up loading is over (`release`): they read end-of-file and exit.

A standby is an ordinary child process of the front, started with the same interpreter, boot
string, environment and file descriptors as a worker: a model cannot tell (its sys.argv is the
worker's, as always); only the process's command line names this module instead of worker.py.

This module imports nothing heavy on purpose: the front imports it before anything else.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
from pathlib import Path
from typing import Optional

# `python -c` rather than `python -m`: -m puts the current directory first on sys.path, where a
# `kernel.py` or a `backends/` folder of the user's would shadow Kernel's own modules. This drops
# that entry ('' for -c) before anything is imported, then runs the module as __main__.
BOOT = (
    "import runpy, sys; del sys.path[0]; name = sys.argv[1]; sys.argv = [name] + sys.argv[2:]; "
    "runpy.run_module(name, run_name='__main__', alter_sys=True)"
)

# At most this many standbys, whatever the repository holds: a standby nobody takes costs a
# worker's imports for nothing, and beyond a few per core they only queue for the CPU.
MAX_STANDBYS = max(4, 2 * (os.cpu_count() or 1))


class Standby:
    """One standby worker process and the front's ends of its channels."""

    def __init__(self, process, channel: socket.socket, fd_channel: socket.socket, assign_fd: int, env: dict):
        self.process = process
        self.channel = channel  # the front's end of the worker's message channel
        self.fd_channel = fd_channel  # the front's end of the worker's SCM_RIGHTS channel
        self.env = env
        self._assign_fd: Optional[int] = assign_fd

    def alive(self) -> bool:
        return self.process.returncode is None

    def assign(self, worker_args: list[str]) -> None:
        """Tell the standby the rest of its worker command line; from here it is that worker."""
        fd, self._assign_fd = self._assign_fd, None
        data = ("\0".join(worker_args)).encode()
        try:
            view = memoryview(data)
            while view:  # far below a pipe's buffer: one write in practice
                view = view[os.write(fd, view):]
        except BrokenPipeError:
            pass  # it died meanwhile: its exit is reported as any worker's that dies starting
        finally:
            os.close(fd)

    def discard(self) -> None:
        """Let the standby go: it reads end-of-file and exits."""
        if self._assign_fd is not None:
            os.close(self._assign_fd)
            self._assign_fd = None
        self.channel.close()
        self.fd_channel.close()


_pool: list[Standby] = []
_reaping: set = set()


def estimate(repositories: list[Path], config_name: str = "", names: Optional[set[str]] = None) -> int:
    """How many worker processes loading every model of these repositories will start, roughly.

    Read from the config text only (no parsing: this runs before the front imports its config
    code): one per Python model folder (of `names` only, when given), or the sum of its instance
    groups' counts. Models with their own execution environment, other backends and ensembles start
    none here.
    """
    total = 0
    for repo in repositories:
        try:
            entries = sorted(os.scandir(repo), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir() or entry.name.startswith(".") or (names is not None and entry.name not in names):
                continue
            text = ""
            for name in ([f"configs/{config_name}.pbtxt"] if config_name else []) + ["config.pbtxt"]:
                try:
                    text = Path(entry.path, name).read_text(errors="replace")
                    break
                except OSError:
                    continue
            text = re.sub(r"#[^\n]*", "", text)
            if "EXECUTION_ENV_PATH" in text or re.search(r"\bplatform\s*:", text):
                continue
            backend = re.search(r"\bbackend\s*:\s*\"([^\"]*)\"", text)
            if backend is not None and backend.group(1) != "python":
                continue
            counts = [int(c) for c in re.findall(r"\bcount\s*:\s*(\d+)", text)]
            total += sum(counts) if counts else 1
            if total >= MAX_STANDBYS:
                return MAX_STANDBYS
    return total


async def prestart(count: int) -> None:
    """Start `count` standby workers with the server's own interpreter and environment."""
    for _ in range(min(count, MAX_STANDBYS)):
        front, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fd_front, fd_worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", BOOT, __name__,
                str(read_fd), "--channel-fd", str(worker.fileno()), "--fd-channel-fd", str(fd_worker.fileno()),
                pass_fds=(worker.fileno(), fd_worker.fileno(), read_fd), env=env,
            )  # fmt: skip
        except OSError:
            for s in (front, worker, fd_front, fd_worker):
                s.close()
            os.close(write_fd)
            return
        finally:
            os.close(read_fd)
        worker.close()
        fd_worker.close()
        _pool.append(Standby(process, front, fd_front, write_fd, env))


def take(command) -> Optional[Standby]:
    """A live standby started exactly as `command` (an execenv.WorkerCommand) would start a worker."""
    if command is None or command.boot or tuple(command.argv) != (sys.executable,):
        return None
    while _pool:
        standby = _pool.pop(0)
        if standby.alive() and standby.env == command.env:
            return standby
        _let_go(standby)
    return None


async def start_worker(command, worker_args: list[str]):
    """(process, channel, fd_channel) of a worker running `worker_args` (its flags after the two
    channel fds): a standby when one fits `command`, else a process started now."""
    ready_made = take(command)
    if ready_made is not None:
        ready_made.assign(worker_args)
        return ready_made.process, ready_made.channel, ready_made.fd_channel
    front, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd_front, fd_worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        argv, env = command.module(
            "kernel.backends.python.worker",
            "--channel-fd", str(worker.fileno()), "--fd-channel-fd", str(fd_worker.fileno()), *worker_args,
        )  # fmt: skip
        process = await asyncio.create_subprocess_exec(*argv, pass_fds=(worker.fileno(), fd_worker.fileno()), env=env)
    except BaseException:
        front.close()
        fd_front.close()
        raise
    finally:
        worker.close()
        fd_worker.close()
    return process, front, fd_front


def release() -> None:
    """Start-up loading is over: let every standby nobody took go."""
    while _pool:
        _let_go(_pool.pop())


def _let_go(standby: Standby) -> None:
    standby.discard()
    task = asyncio.ensure_future(standby.process.wait())  # reaped, not left a zombie
    _reaping.add(task)
    task.add_done_callback(_reaping.discard)


def _standby_main(argv: list[str]) -> None:
    """In the standby process: import what every worker imports, wait for the assignment, run."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the worker: the front decides when we stop
    assign_fd, channel_args = int(argv[0]), argv[1:]
    from kernel.backends.python import worker

    chunks = []
    while True:
        chunk = os.read(assign_fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(assign_fd)
    if not chunks:  # released: the front did not need this one
        return
    worker.main(channel_args + b"".join(chunks).decode().split("\0"))


if __name__ == "__main__":
    _standby_main(sys.argv[1:])
