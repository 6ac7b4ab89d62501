"""The metrics endpoint: `GET /metrics` in Prometheus text format, on its own port.

A raw ASGI app on uvicorn (like the HTTP transport) inside the front process's
event loop. The text is built at scrape time by kernel.metrics; nothing here
touches the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from kernel.metrics import MetricsConfig, MetricsService
from kernel.transport import Transport

log = logging.getLogger("kernel.metrics")

_TEXT = [(b"content-type", b"text/plain; charset=utf-8")]
_JSON = [(b"content-type", b"application/json")]


class MetricsApp:
    def __init__(self, service: MetricsService):
        self.service = service

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["method"] != "GET":
            await _send(send, 405, _JSON, b'{"error":"Method Not Allowed"}')
            return
        # As tritonserver: /metrics answers with the metrics; any other path
        # answers 200 with an empty body.
        body = self.service.text().encode() if scope["path"] == "/metrics" else b""
        await _send(send, 200, _TEXT, body)


async def _send(send, status: int, headers, body: bytes) -> None:
    headers = headers + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class MetricsTransport(Transport):
    service_name = "Metrics Service"

    def __init__(self, server, address: str = "0.0.0.0", port: int = 8002,
                 config: MetricsConfig | None = None, interval_ms: int = 2000, cpu_metrics: bool = True):
        self.server = server
        self.address = address
        self.port = port
        self.service = MetricsService(server, config or server.metrics_config, cpu_metrics, interval_ms)
        self.app = MetricsApp(self.service)
        self._uvicorn = None
        self._task: asyncio.Task | None = None

    async def start(self) -> str:
        import uvicorn

        config = uvicorn.Config(
            self.app, host=self.address, port=self.port, http="httptools", loop="none",
            lifespan="off", access_log=False, log_level="warning", timeout_graceful_shutdown=None,
        )

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # the front process owns signal handling
                yield

        self._uvicorn = _Server(config)
        config.load()
        self._uvicorn.lifespan = config.lifespan_class(config)
        await self._uvicorn.startup()
        if self._uvicorn.should_exit:
            raise OSError(f"could not listen on {self.address}:{self.port} for metrics")
        self._task = asyncio.ensure_future(self._uvicorn.main_loop())
        self.service.start_polling(asyncio.get_running_loop())
        return f"{self.address}:{self.port}"

    async def stop(self) -> None:
        self.service.stop_polling()
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            if self._task is not None:
                await self._task
            await self._uvicorn.shutdown()
