"""The listening sockets of the transports: bound here, so every listener binds the same way.

With several front processes (`kernel serve --front-processes N`, kernel.serve.fronts) every front
binds the same address and port with SO_REUSEPORT and the kernel spreads new connections over
them. Measured (benchmarks/front_spread.py, 4 processes, 64 and 256 connections): the busiest
front got 1.09-1.25x its even share with SO_REUSEPORT, 1.9-3.1x with one listening socket
inherited by all (whichever process wakes first takes the whole burst). The supervisor holds the
port meanwhile with a socket that is bound but never listens (`reserve`): it gets no
connections, and a front that restarts binds beside it. A front sets `shared_ports` before its
transports start.
"""

from __future__ import annotations

import socket

# Set by a front process: bind with SO_REUSEPORT, beside the other fronts.
shared_ports = False


def bind(host: str, port: int, what: str) -> socket.socket:
    """A TCP socket bound to host:port (not listening yet): OSError naming what it was for when
    the port is taken or the address is not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared_ports:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"could not listen on {host}:{port} for {what}: {exc.strerror}") from None
    return sock


def reserve(host: str, port: int, what: str) -> socket.socket:
    """The supervisor's hold on a port its fronts will share: bound with SO_REUSEPORT, never listening
    (so it takes no connections); port 0 picks one, read from getsockname()."""
    global shared_ports
    saved, shared_ports = shared_ports, True
    try:
        return bind(host, port, what)
    finally:
        shared_ports = saved
