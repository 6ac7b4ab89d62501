"""PyTriton-compatible clients (`pytriton.client` -> `kernel.client`).

ModelClient, AsyncioModelClient and FuturesModelClient call ordinary models over HTTP
or gRPC; DecoupledModelClient and AsyncioDecoupledModelClient read the response
streams of decoupled models over gRPC. They work against any KServe v2 server.
"""

from kernel.client.aio import AsyncioDecoupledModelClient, AsyncioModelClient
from kernel.client.futures import FuturesModelClient
from kernel.client.sync import DecoupledModelClient, ModelClient

__all__ = [
    "AsyncioDecoupledModelClient", "AsyncioModelClient", "DecoupledModelClient", "FuturesModelClient", "ModelClient",
]
