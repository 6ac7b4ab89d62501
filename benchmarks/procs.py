"""Which process of a running server is which, and the CPU each kind of process used over a window.

Issue 32 asks for CPU per request per process type: with `kernel serve --front-processes N` the
server is a supervisor (the `kernel serve` process: models, workers, metrics), N front processes
(`kernel.serve.fronts.front`: the client transports) and one worker per model instance; with one
front the `kernel serve` process is the front itself. Real Triton is one `tritonserver` process and
one Python-backend stub per instance. A kind's CPU is utime + stime from /proc/<pid>/stat (every
thread of the process) read before and after a window; a process that starts or ends inside the
window counts from 0 or up to its last reading, which is said in the result (`changed`).

Also: which listening port a process's established TCP connections belong to (the spread of client
connections over the fronts), from /proc/<pid>/fd and /proc/net/tcp{,6}.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")

FRONT, SUPERVISOR, WORKER, SERVER, STUB, OTHER = "front", "supervisor", "worker", "tritonserver", "stub", "other"
# Columns of the tables, in order: Kernel's kinds, then Triton's.
KINDS = (FRONT, WORKER, SUPERVISOR, SERVER, STUB, OTHER)


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name ([0] state, [1] ppid, [11] utime, [12] stime)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """PID and every live process below it (zombies left out)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry))
        except (OSError, IndexError):
            continue
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def kind_of(cmd: str) -> str:
    """The kind of a process below a server's main process, from its command line."""
    if "kernel.serve.fronts.front" in cmd:
        return FRONT
    if "kernel.backends.python.worker" in cmd or "kernel.backends.python.standby" in cmd:
        return WORKER  # a standby is a worker not yet given its model (its command line says which it became)
    if "triton_python_backend_stub" in cmd:
        return STUB
    return OTHER


def classify(main_pid: int) -> dict[int, str]:
    """pid -> kind for a server's process tree. Kernel's main process is the supervisor when fronts
    run below it, else the (only) front; real Triton's main process is tritonserver."""
    kinds = {p: kind_of(cmdline(p)) for p in descendants(main_pid) if p != main_pid}
    main_cmd = cmdline(main_pid)
    if "tritonserver" in main_cmd:
        kinds[main_pid] = SERVER
    else:
        kinds[main_pid] = SUPERVISOR if FRONT in kinds.values() else FRONT
    return kinds


def cpu_ticks(pid: int) -> int | None:
    try:
        f = _stat_fields(pid)
        return int(f[11]) + int(f[12])
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class Snapshot:
    """CPU ticks of every process of a server at one moment, with their kinds."""

    kinds: dict[int, str]
    ticks: dict[int, int]

    @classmethod
    def take(cls, main_pid: int, extra: dict[int, str] | None = None) -> "Snapshot":
        """EXTRA: more processes to read (pid -> kind), such as the load client."""
        kinds = classify(main_pid)
        kinds.update(extra or {})
        ticks = {p: t for p in kinds if (t := cpu_ticks(p)) is not None}
        return cls({p: k for p, k in kinds.items() if p in ticks}, ticks)


@dataclass
class KindCpu:
    seconds: float = 0.0
    processes: int = 0
    per_process: list = field(default_factory=list)  # seconds of each process, largest first


def cpu_between(before: Snapshot, after: Snapshot) -> tuple[dict[str, KindCpu], int]:
    """CPU seconds per kind between two snapshots, and how many processes came or went meanwhile."""
    out: dict[str, KindCpu] = {}
    changed = 0
    for pid in set(before.ticks) | set(after.ticks):
        if pid not in before.ticks or pid not in after.ticks:
            changed += 1
        t0, t1 = before.ticks.get(pid, 0), after.ticks.get(pid, before.ticks.get(pid, 0))
        kind = after.kinds.get(pid) or before.kinds.get(pid) or OTHER
        k = out.setdefault(kind, KindCpu())
        secs = max(0, t1 - t0) / TICK
        k.seconds += secs
        k.processes += 1
        k.per_process.append(round(secs, 3))
    for k in out.values():
        k.per_process.sort(reverse=True)
    return out, changed


def box_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat: the box's own load over a window."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    vals = [int(x) for x in parts[:8]]
    idle = vals[3] + vals[4]  # idle + iowait
    return sum(vals) - idle, sum(vals)


# ---- connections ----------------------------------------------------------------------------


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    except OSError:
        pass
    return out


def tcp_table() -> list[dict]:
    """Every TCP socket of the box: local/remote port, state, tx/rx queue bytes, inode."""
    rows = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if len(f) < 10:
                continue
            tx, rx = (int(x, 16) for x in f[4].split(":"))
            rows.append({"local_port": int(f[1].rsplit(":", 1)[1], 16), "remote_port": int(f[2].rsplit(":", 1)[1], 16),
                         "state": f[3], "tx_queue": tx, "rx_queue": rx, "inode": int(f[9])})
    return rows


ESTABLISHED = "01"


def connections_per_process(pids: list[int], port: int, table: list[dict] | None = None) -> dict[int, int]:
    """How many established connections to PORT (server side) each of PIDS holds."""
    table = tcp_table() if table is None else table
    served = {r["inode"] for r in table if r["local_port"] == port and r["state"] == ESTABLISHED}
    return {p: len(_socket_inodes(p) & served) for p in pids}


def queues_on(port: int, table: list[dict] | None = None) -> dict:
    """Bytes waiting in the kernel's socket queues on both ends of the established connections to
    PORT: rx on the server side = sent by the client, not yet read by the server; rx on the client
    side = sent by the server, not yet read by the client. A stall with bytes waiting names the side
    that stopped reading; with none waiting, both sides wait on each other (flow control, limits)."""
    table = tcp_table() if table is None else table
    srv = [r for r in table if r["local_port"] == port and r["state"] == ESTABLISHED]
    cli = [r for r in table if r["remote_port"] == port and r["state"] == ESTABLISHED]
    return {"connections": len(srv), "server_rx_bytes": sum(r["rx_queue"] for r in srv),
            "server_tx_bytes": sum(r["tx_queue"] for r in srv), "client_rx_bytes": sum(r["rx_queue"] for r in cli),
            "client_tx_bytes": sum(r["tx_queue"] for r in cli)}
