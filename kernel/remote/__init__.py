"""PyTriton's remote mode (RemoteTriton): callables in this process served by a server in another."""

from kernel.remote.triton import RemoteTriton

__all__ = ["RemoteTriton"]
