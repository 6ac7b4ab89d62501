"""Run model_repo_examples/pytriton_*.py as the user would: a subprocess on free ports."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import conftest
from conftest import EXAMPLES, ServerProcess, free_ports


class ExampleProcess(ServerProcess):
    name = "example"

    def __init__(self, script: str, models: list[str], env: dict | None = None):
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.models = models
        self.home = tempfile.mkdtemp(prefix="pytriton-test-home-")
        super().__init__([sys.executable, str(EXAMPLES / script)], Path(self.home) / "server.log",
                         {"PYTRITON_HOME": self.home, **self.port_env(), **(env or {})})

    def port_env(self) -> dict:
        """The examples take their ports the PyTriton way, from PYTRITON_TRITON_CONFIG_*."""
        return {"PYTRITON_TRITON_CONFIG_HTTP_PORT": str(self.http_port),
                "PYTRITON_TRITON_CONFIG_GRPC_PORT": str(self.grpc_port),
                "PYTRITON_TRITON_CONFIG_METRICS_PORT": str(self.metrics_port)}

    def wait_ready(self, timeout: float = 60.0) -> "ExampleProcess":
        """Ready when every model answers its readiness endpoint (bind() happens after the server starts)."""
        return self.wait_until_ok([f"/v2/models/{m}/ready" for m in self.models], timeout)


def running(script: str, models: list[str], env: dict | None = None):
    """Body of a module-scoped fixture: `yield from running(...)` gives a ready example server."""
    yield from conftest.running(ExampleProcess(script, models, env))
