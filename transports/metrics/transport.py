"""The metrics endpoint: `GET /metrics` in Prometheus text format, on its own port.

A raw ASGI app on uvicorn (like the HTTP transport) inside the front process's
event loop. The text is built at scrape time by kernel.observe.metrics; nothing here
touches the request path.
"""

from __future__ import annotations

import asyncio
import logging

from kernel.observe.metrics import MetricsConfig, MetricsService
from kernel.core.transport import Transport
from kernel.transports.asgi import UvicornListener, lifespan, send_response

log = logging.getLogger("kernel.observe.metrics")

_TEXT = [(b"content-type", b"text/plain; charset=utf-8")]
_JSON = [(b"content-type", b"application/json")]


class MetricsApp:
    def __init__(self, service: MetricsService):
        self.service = service

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] != "GET":
            await send_response(send, 405, _JSON, b'{"error":"Method Not Allowed"}')
            return
        # As tritonserver: /metrics answers with the metrics; any other path
        # answers 200 with an empty body.
        body = (await self.service.total_text()).encode() if scope["path"] == "/metrics" else b""
        await send_response(send, 200, _TEXT, body)


class MetricsTransport(Transport):
    service_name = "Metrics Service"

    def __init__(self, server, address: str = "0.0.0.0", port: int = 8002,
                 config: MetricsConfig | None = None, interval_ms: int = 2000, cpu_metrics: bool = True,
                 gpu_metrics: bool = True):
        self.server = server
        self.address = address
        self.port = port
        self.service = MetricsService(server, config or server.metrics_config, cpu_metrics, interval_ms,
                                      gpu_metrics=gpu_metrics)
        self.app = MetricsApp(self.service)
        self._uvicorn: UvicornListener | None = None

    async def start(self) -> str:
        self._uvicorn = UvicornListener(self.app, self.address, self.port, "metrics")
        await self._uvicorn.start()
        self.service.start_polling(asyncio.get_running_loop())
        return f"{self.address}:{self.port}"

    async def stop(self) -> None:
        self.service.stop_polling()
        if self._uvicorn is not None:
            await self._uvicorn.stop()
