"""Bound Python callables (Triton.bind) served inside the server's own process."""

from kernel.backends.callable.backend import BoundModel, CallableBackend

__all__ = ["BoundModel", "CallableBackend"]
