"""Bound Python callables (kernel.triton.Triton.bind): the callable backend, composed into an
in-process server in front of the Python backend.

The PyTriton face describes models; which backend runs them is composition's business, so
kernel.triton reaches the callable backend only through here.
"""

from __future__ import annotations

from kernel.backends.callable import BoundModel, CallableBackend
from kernel.core.server import Server

__all__ = ["BoundModel", "CallableBackend", "install_callable_backend"]


def install_callable_backend(server: Server, models: list[BoundModel]) -> CallableBackend:
    """Serve `models` from this process; model.py models in the same server still go to the
    Python backend (the callable backend falls back to it)."""
    backend = CallableBackend(fallback=server.backends.get("python"))
    backend.attach(server)
    server.backends["python"] = backend
    for model in models:
        backend.register(model)
    return backend
