"""Helpers for tests of a server with several front processes (kernel.serve.fronts).

Which front holds a connection is read from /proc, as an operator would find it: the front
process whose file descriptors include the server side of that TCP connection. No debug header
or endpoint is needed, so what is tested is what runs.
"""

from __future__ import annotations

import http.client
import os
import socket
import time
from pathlib import Path
from typing import Optional


def front_pids(supervisor_pid: int) -> dict[int, int]:
    """{pid: front index} of the supervisor's front processes."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid != supervisor_pid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"kernel.serve.fronts.front" in argv and b"--index" in argv:
            out[int(entry.name)] = int(argv[argv.index(b"--index") + 1])
    return out


def wait_for_fronts(supervisor_pid: int, count: int, timeout: float = 30.0, exclude=()) -> dict[int, int]:
    """The supervisor's fronts once there are `count` of them (none of the pids in `exclude`)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = {p: i for p, i in front_pids(supervisor_pid).items() if p not in exclude}
        if len(pids) == count or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def _server_inode(server_port: int, client_port: int) -> Optional[int]:
    """The inode of the server side of the loopback connection client_port -> server_port."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], int(fields[9])
            if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
                return inode
    return None


def front_of(client_port: int, server_port: int, pids: dict[int, int], timeout: float = 5.0) -> Optional[int]:
    """The index of the front holding the connection from client_port (None if none is found in time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inode = _server_inode(server_port, client_port)
        if inode is not None:
            for pid, index in pids.items():
                if inode in _socket_inodes(pid):
                    return index
        time.sleep(0.02)
    return None


def http_connection_to(port: int, index: int, pids: dict[int, int], tries: int = 200) -> http.client.HTTPConnection:
    """A keep-alive HTTP connection to 127.0.0.1:port that front `index` accepted."""
    for _ in range(tries):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.connect()
        client_port = conn.sock.getsockname()[1]
        conn.request("GET", "/v2/health/live")  # accepted (and answered) by now
        conn.getresponse().read()
        if front_of(client_port, port, pids) == index:
            return conn
        conn.close()
    raise AssertionError(f"no connection landed on front {index} in {tries} tries")


def socket_front(sock: socket.socket, server_port: int, pids: dict[int, int]) -> Optional[int]:
    return front_of(sock.getsockname()[1], server_port, pids)
