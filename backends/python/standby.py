"""Standby workers: worker processes started before the front knows which model each will run.

Why: on a small box the start-up of `kernel serve` is two long stretches one after the other — the
front imports the server (numpy, protobuf, the transports: ~0.3 s on one core) and only then starts
one worker per instance, each of which spends ~0.1 s importing numpy, asyncio, uvloop and msgspec
before model.py is even read. `kernel serve` instead starts, as its very first step, one standby
per instance it expects to start (`estimate`): a plain worker interpreter that does those imports
at once, in parallel with the front, then blocks until the front tells it which model to run.
`WorkerInstance.start` takes a standby when one is left whose interpreter and environment are the
ones it would have started itself (`take`); otherwise it starts a worker as before. Standbys nobody
took are let go once start-up loading is over (`release`): they read end-of-file and exit. All
standbys but the first are forked from it once its imports are done (standby_fork.py), so the
imports are paid once, not once per instance.

A standby is a child process of the front (a forked one is re-parented to it), with the same
interpreter, boot string, environment and file descriptors as a worker: a model cannot tell (its
sys.argv is the worker's, as always). Once assigned, it rewrites its command line (what `ps` and
/proc/PID/cmdline show) to name the worker module, its instance and model file, as a worker
started for its instance shows them (`_retitle`).

A standby that cannot serve (stopped, killed, or silent after its assignment) never fails an
instance's start: `take` skips one that is stopped or dead (and kills it), and the instance starts
a fresh worker when the one it took does not report in: at once when it is stopped or dead
(`wait_for_report`), else after REPORT_S (instance.py). A worker that dies before its instance has
started is not restarted behind the start's back: the start replaces it (issue 31, D13: a restart
racing the start reset the instance under it, `'NoneType' object has no attribute 'pid'`).

This module imports nothing heavy on purpose: the front imports it before anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import sys
from pathlib import Path
from typing import Optional

from kernel.backends.python import standby_fork

# `python -c` rather than `python -m`: -m puts the current directory first on sys.path, where a
# `kernel.py` or a `backends/` folder of the user's would shadow Kernel's own modules. This drops
# that entry ('' for -c) before anything is imported, then runs the module as __main__.
BOOT = (
    "import runpy, sys; del sys.path[0]; name = sys.argv[1]; sys.argv = [name] + sys.argv[2:]; "
    "runpy.run_module(name, run_name='__main__', alter_sys=True)"
)

# KERNEL_STANDBY_WORKERS=0 starts none: every worker is then a fresh interpreter, as before standbys
# existed (for comparing the two, and for tests whose premise is a worker's full start-up time).
ENABLED = os.environ.get("KERNEL_STANDBY_WORKERS", "1") != "0"

# At most this many standbys, whatever the repository holds: a standby nobody takes costs a
# worker's imports for nothing, and beyond a few per core they only queue for the CPU.
MAX_STANDBYS = max(4, 2 * (os.cpu_count() or 1))

# How long a standby (imports done) may take to report in before its instance starts a fresh worker
# instead, and how often the instance looks meanwhile whether it still can (wait_for_report).
REPORT_S = 5.0
REPORT_POLL_S = 0.05


class Standby:
    """One standby worker process and the front's ends of its channels."""

    def __init__(self, process, channel: socket.socket, fd_channel: socket.socket, assign_fd: int, env: dict):
        self.process = process
        self.channel = channel  # the front's end of the worker's message channel
        self.fd_channel = fd_channel  # the front's end of the worker's SCM_RIGHTS channel
        self.env = env
        self.discarded = False
        self._assign_fd: Optional[int] = assign_fd

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

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
        self.discarded = True
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
    """Start `count` standby workers with the server's own interpreter and environment: one process
    that the others are forked from (standby_fork.py), or, where that cannot be, one process each."""
    count = min(count, MAX_STANDBYS) if ENABLED else 0
    if count <= 0:
        return
    groups = [_Fds() for _ in range(count)]
    if count > 1 and standby_fork.become_subreaper():
        await _spawn(groups[0], groups[1:])
    else:
        for fds in groups:
            await _spawn(fds, [])


class _Fds:
    """The two socket pairs and the assignment pipe of one standby."""

    def __init__(self) -> None:
        self.front, self.worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.fd_front, self.fd_worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.read_fd, self.write_fd = os.pipe()

    def theirs(self) -> tuple[int, int, int]:
        return self.read_fd, self.worker.fileno(), self.fd_worker.fileno()

    def close_theirs(self) -> None:
        self.worker.close()
        self.fd_worker.close()
        os.close(self.read_fd)

    def close_ours(self) -> None:
        self.front.close()
        self.fd_front.close()
        os.close(self.write_fd)


async def _spawn(fds: _Fds, clones: list[_Fds]) -> None:
    env = dict(os.environ)
    extra, pass_fds, report = [], list(fds.theirs()), None
    if clones:
        report, report_w = os.pipe()
        extra = ["--clones", ";".join(",".join(map(str, c.theirs())) for c in clones), "--report-fd", str(report_w)]
        pass_fds += [fd for c in clones for fd in c.theirs()] + [report_w]
    read_fd, channel, fd_channel = fds.theirs()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", BOOT, __name__, *extra,
            str(read_fd), "--channel-fd", str(channel), "--fd-channel-fd", str(fd_channel),
            pass_fds=pass_fds, env=env,
        )  # fmt: skip
    except OSError:
        for f in (fds, *clones):
            f.close_theirs()
            f.close_ours()
        if report is not None:
            os.close(report)
            os.close(report_w)
            standby_fork.become_subreaper(False)
        return
    finally:
        if report is not None:
            os.close(report_w)
    for f in (fds, *clones):
        f.close_theirs()
    _pool.append(Standby(process, fds.front, fds.fd_front, fds.write_fd, env))
    if clones:
        pending = [Standby(None, c.front, c.fd_front, c.write_fd, env) for c in clones]
        _pool.extend(pending)
        _watch(asyncio.ensure_future(_adopt(report, pending)))


async def _adopt(report: int, pending: list[Standby]) -> None:
    """Read the clones' pids as the template reports them; a clone whose pid never comes is gone."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(report, "rb"))
    try:
        while line := await reader.readline():
            index, pid = map(int, line.split())
            clone = pending[index]
            clone.process = standby_fork.AdoptedProcess(pid)
            if clone.discarded:  # released before its pid came: reap it when it exits
                _watch(asyncio.ensure_future(clone.process.wait()))
            _tell()
    finally:
        transport.close()
        standby_fork.become_subreaper(False)  # clones made: orphans go to init again, as usual
        for clone in pending:
            if clone.process is None:
                if clone in _pool:
                    _pool.remove(clone)
                if not clone.discarded:
                    clone.discard()
        _tell()


_waiting: Optional[asyncio.Future] = None


def _news() -> asyncio.Future:
    """Done at the next change of the clones (one adopted, or no more to come)."""
    global _waiting
    if _waiting is None or _waiting.done():
        _waiting = asyncio.get_running_loop().create_future()
    return asyncio.shield(_waiting)


def _tell() -> None:
    if _waiting is not None and not _waiting.done():
        _waiting.set_result(None)


def take_fits(command) -> bool:
    """Whether a standby can stand for a worker started by `command` (an execenv.WorkerCommand)."""
    return command is not None and not command.boot and tuple(command.argv) == (sys.executable,)


def take(command) -> Optional[Standby]:
    """A live standby started exactly as `command` (an execenv.WorkerCommand) would start a worker."""
    if not take_fits(command):
        return None
    for standby in list(_pool):
        if standby.process is None:  # a clone not forked yet: maybe the next instance's
            continue
        _pool.remove(standby)
        if standby.alive() and standby.env == command.env and _runnable(standby.process.pid):
            return standby
        _let_go(standby)
    return None


async def wait_for_report(process, futures, limit: float) -> None:
    """Wait up to `limit` seconds for the first of `futures` (a standby just taken reporting in), and
    no longer once it cannot report: a standby stopped (SIGSTOP) or killed after it was taken never
    will, and its instance starts a fresh worker at once instead of after the whole `limit`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not any(f.done() for f in futures) and _runnable(process.pid):
        left = deadline - loop.time()
        if left <= 0:
            return
        await asyncio.wait(futures, timeout=min(left, REPORT_POLL_S), return_when=asyncio.FIRST_COMPLETED)


def _runnable(pid: int) -> bool:
    """Not stopped (SIGSTOP, a debugger) and not dead: a standby in either state would never report in."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return sys.platform != "linux"  # no /proc: nothing to tell by (the instance's wait still bounds it)
    return state not in (b"T", b"t", b"Z", b"X")


async def start_worker(command, worker_args: list[str], standby_ok: bool = True):
    """(process, channel, fd_channel, from_standby) of a worker running `worker_args` (its flags
    after the two channel fds): a standby when one fits `command` (and standby_ok), else a process
    started now."""
    ready_made = take(command) if standby_ok else None
    while (standby_ok and ready_made is None and any(s.process is None and not s.discarded for s in _pool)
           and take_fits(command)):
        await _news()  # a clone is being forked: it is ready in a few ms, much sooner than a new process
        ready_made = take(command)
    if ready_made is not None:
        ready_made.assign(worker_args)
        return ready_made.process, ready_made.channel, ready_made.fd_channel, True
    with socket_pairs() as (front, worker, fd_front, fd_worker):
        argv, env = command.module(
            "kernel.backends.python.worker",
            "--channel-fd", str(worker.fileno()), "--fd-channel-fd", str(fd_worker.fileno()), *worker_args,
        )  # fmt: skip
        process = await asyncio.create_subprocess_exec(*argv, pass_fds=(worker.fileno(), fd_worker.fileno()), env=env)
    return process, front, fd_front, False


@contextlib.contextmanager
def socket_pairs():
    """The sockets of a worker's channel (or of a link to it): (front, worker, fd_front, fd_worker),
    a stream pair for messages and a datagram pair for fds (SCM_RIGHTS). The worker's ends are
    closed on leaving (they were handed over: passed or sent), the front's too on an error."""
    front, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd_front, fd_worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        yield front, worker, fd_front, fd_worker
    except BaseException:
        front.close()
        fd_front.close()
        raise
    finally:
        worker.close()
        fd_worker.close()


def release() -> None:
    """Start-up loading is over: let every standby nobody took go."""
    while _pool:
        _let_go(_pool.pop())


def _let_go(standby: Standby) -> None:
    standby.discard()
    if standby.process is not None:  # (a clone not forked yet is reaped once its pid comes: _adopt)
        if standby.alive() and not _runnable(standby.process.pid):
            kill(standby.process)  # stopped: it would never read its end-of-file and exit
        _watch(asyncio.ensure_future(standby.process.wait()))  # reaped, not left a zombie


def kill(process) -> None:
    """SIGKILL a standby's (or a worker's) process, if it is still there."""
    try:
        process.kill()
    except ProcessLookupError:
        pass


def _watch(task: asyncio.Future) -> None:
    _reaping.add(task)
    task.add_done_callback(_reaping.discard)


def _standby_main(argv: list[str]) -> None:
    """In the standby process: import what every worker imports, make the clones the front asked
    for (standby_fork.py), wait for the assignment, run."""
    from kernel.backends.python.stop_signals import hold_stop_signals

    hold_stop_signals()  # as the worker: the front decides when we stop
    clones = report = None
    if argv[0] == "--clones":
        clones, report, argv = argv[1], int(argv[3]), argv[4:]
    assign_fd, channel_args = int(argv[0]), argv[1:]
    from kernel.backends.python import worker  # noqa: F401 - the imports, done once for every clone

    if clones is not None:
        from kernel.backends.python import standby_fork

        own = (assign_fd, int(channel_args[1]), int(channel_args[3]))
        standby_fork.make_clones(clones, report, own, lambda fd, args: _run(fd, args, forked=True))
    _run(assign_fd, channel_args)


def _run(assign_fd: int, channel_args: list[str], forked: bool = False) -> None:
    """Wait for the assignment on `assign_fd`, then be that worker; return if released."""
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
    worker_args = b"".join(chunks).decode().split("\0")
    _retitle(worker_args, forked)
    worker.main(channel_args + worker_args)


def _retitle(worker_args: list[str], forked: bool = False) -> None:
    """Make this process's command line (ps, /proc/PID/cmdline) name the worker it now is.

    A worker started for its instance shows `kernel.backends.python.worker --model-file F
    --instance-name I` there; a standby showed only this module. Linux reads a command line from the
    process's original argv area, so the new one is written there (no longer than the old one: the
    tail is cut, which is why the instance name comes first). Nothing in Python reads that area
    (sys.argv and sys.orig_argv are copies).
    """
    flags = dict(zip(worker_args[::2], worker_args[1::2]))
    words = [sys.executable, "kernel.backends.python.worker", "--instance-name", flags.get("--instance-name", "?"),
             "--model-file", flags.get("--model-file", "?"),
             f"({'forked from' if forked else 'started as'} kernel.backends.python.standby)"]
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49)
    except (OSError, IndexError, ValueError):
        return
    room = end - start
    if room < 2:
        return
    title = "\0".join(words).encode()[: room - 1]
    import ctypes

    ctypes.memmove(start, title.ljust(room, b"\0"), room)


if __name__ == "__main__":
    _standby_main(sys.argv[1:])
