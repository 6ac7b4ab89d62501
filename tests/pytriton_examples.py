"""Run model_repo_examples/pytriton_*.py as the user would: a subprocess on free ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from conftest import EXAMPLES, ROOT, free_ports


class ExampleProcess:
    def __init__(self, script: str, models: list[str], env: dict | None = None):
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.models = models
        self.home = tempfile.mkdtemp(prefix="pytriton-test-home-")
        self.log_path = Path(self.home) / "server.log"
        self._log = open(self.log_path, "w+b")
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLES / script)],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTRITON_HOME": self.home, **self.port_env(), **(env or {})},
        )

    def port_env(self) -> dict:
        """The examples take their ports the PyTriton way, from PYTRITON_TRITON_CONFIG_*."""
        return {"PYTRITON_TRITON_CONFIG_HTTP_PORT": str(self.http_port),
                "PYTRITON_TRITON_CONFIG_GRPC_PORT": str(self.grpc_port),
                "PYTRITON_TRITON_CONFIG_METRICS_PORT": str(self.metrics_port)}

    @property
    def url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> "ExampleProcess":
        """Ready when every model answers its readiness endpoint (bind() happens after the server starts)."""
        deadline = time.time() + timeout
        pending = list(self.models)
        while pending and time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"example exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/models/{pending[0]}/ready", timeout=1) as r:
                    if r.status == 200:
                        pending.pop(0)
                        continue
            except OSError:
                pass
            time.sleep(0.05)
        if pending:
            raise RuntimeError(f"models {pending} did not become ready:\n{self.log()}")
        return self

    def stop(self, timeout: float = 30.0) -> int:
        """Ctrl-C, as a user would stop it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def running(script: str, models: list[str], env: dict | None = None):
    """Body of a module-scoped fixture: `yield from running(...)` gives a ready example server."""
    example = ExampleProcess(script, models, env)
    try:
        yield example.wait_ready()
    finally:
        example.stop()
