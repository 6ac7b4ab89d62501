"""A real redis-server for the tests, started and stopped by them.

`redis-server` is the Debian package `redis-server` (`make test` installs it with apt-get when it is
missing; see the Makefile). When it is not on PATH this tries the same install once, and fails the
test with what to do when that is not possible: the redis cache tests never pass by skipping.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import free_port

_install_tried = False


def redis_server_binary() -> str:
    global _install_tried
    found = shutil.which("redis-server")
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt and not _install_tried and os.geteuid() == 0:
        _install_tried = True
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run([apt, "update", "-qq"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        subprocess.run([apt, "install", "-y", "-qq", "redis-server"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env)
        found = shutil.which("redis-server")
        if found:
            return found
    pytest.fail("the redis cache tests need redis-server (Debian/Ubuntu package redis-server: "
                "apt-get install redis-server; `make test` installs it where apt-get is available)")


class RedisServer:
    """redis-server on a free local port, with nothing saved to disk."""

    def __init__(self, workdir: Path, *extra: str, port: int = 0, tls: dict | None = None):
        self.workdir = workdir
        self.extra = extra
        self.port = port or free_port()
        self.tls = tls
        self.proc = None
        self.start()

    def start(self) -> "RedisServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [redis_server_binary(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.workdir), "--enable-debug-command", "local"]
        if self.tls:
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", self.tls["cert"],
                     "--tls-key-file", self.tls["key"], "--tls-ca-cert-file", self.tls["ca"],
                     "--tls-auth-clients", "no"]
        else:
            args += ["--port", str(self.port)]
        self._log = open(self.workdir / f"redis-{self.port}.log", "ab")
        self.proc = subprocess.Popen([*args, *self.extra], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.workdir / f'redis-{self.port}.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start listening")

    def kill(self) -> None:
        """SIGKILL, as a crashed or unplugged Redis."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def command(self, *args: str) -> str:
        """A redis-cli command against this server (plain TCP only)."""
        cli = shutil.which("redis-cli") or str(Path(redis_server_binary()).with_name("redis-cli"))
        out = subprocess.run([cli, "-p", str(self.port), *args], capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    def flags(self, *settings: str) -> list[str]:
        """`--cache-config redis,...` flags naming this server, plus any extra settings."""
        out = ["--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={self.port}"]
        for s in settings:
            out += ["--cache-config", f"redis,{s}"]
        return out
