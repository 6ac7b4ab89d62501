"""Runs the HTTP app inside the front process's event loop.

uvicorn with httptools is the default (fastest measured here); hypercorn stays
selectable with --http-server hypercorn for those who want its HTTP/2.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

from kernel.transports.restrictions import Restrictions
from kernel.core.server import Server, StartupError
from kernel.core.transport import Transport
from kernel.transports.asgi import UvicornListener
from kernel.transports.http_limits import Http1Limits
from kernel.transports.http.app import DEFAULT_MAX_JSON_OUTPUT_SIZE, HttpApp
from kernel.transports.http import fast

log = logging.getLogger("kernel.http")

HTTP_SERVERS = ("uvicorn", "hypercorn")


class HttpTransport(Transport):
    service_name = "HTTPService"
    # The fast path answers KServe's infer route; a subclass serving another app on its own port
    # (SageMaker, Vertex AI: transports/cloud.py) must not answer that route there.
    fast_path = True

    def __init__(self, server: Server, address: str = "0.0.0.0", port: int = 8000,
                 max_input_size: int = 64 * 1024 * 1024, http_server: str = "uvicorn",
                 restricted: Optional[Restrictions] = None,
                 max_json_output_size: int = DEFAULT_MAX_JSON_OUTPUT_SIZE):
        """restricted: API groups that need a header (--http-restricted-api); None restricts nothing.
        max_json_output_size: the most bytes an answer's JSON may take (--http-max-json-output-size)."""
        if http_server not in HTTP_SERVERS:
            raise ValueError(f"unknown HTTP server '{http_server}' (choose from {', '.join(HTTP_SERVERS)})")
        self.app = HttpApp(server, max_input_size, restricted, max_json_output_size)
        self.http_app = self.app  # the KServe app (a cloud front serves another app around it: transports/cloud.py)
        self.server = server
        # Header size and header/body read timeouts per connection (--http-max-header-size,
        # --http-header-timeout-secs, --http-body-timeout-secs; kernel.transports.http_limits).
        self.limits = Http1Limits()
        self.address = address
        self.port = port
        self.http_server = http_server
        self._task: asyncio.Task | None = None
        self._uvicorn = None
        self._hypercorn_stop: asyncio.Event | None = None

    async def start(self) -> str:
        if self.http_server == "uvicorn":
            await self._start_uvicorn()
        else:
            await self._start_hypercorn()
        return f"{self.address}:{self.port}"

    async def _start_uvicorn(self) -> None:
        # Plain infer requests take the fast path (transports/http/fast.py), the rest the ASGI app.
        protocol = fast.protocol_for(self.app, self.limits) if fast.ENABLED and self.fast_path else None
        self._uvicorn = UvicornListener(self.app, self.address, self.port, "HTTP", self.limits, protocol,
                                        max_body=self.http_app.max_input_size, held=self.server.held_output)
        await self._uvicorn.start()

    async def _start_hypercorn(self) -> None:
        try:
            from hypercorn.asyncio import serve
            from hypercorn.config import Config
        except ImportError as exc:
            raise StartupError(
                f"--http-server hypercorn needs hypercorn ({exc}): pip install 'kernel-inference-server[hypercorn]'"
            ) from None

        config = Config()
        config.bind = [f"{self.address}:{self.port}"]
        config.accesslog = None
        config.errorlog = None
        self._hypercorn_stop = asyncio.Event()
        self._task = asyncio.ensure_future(serve(self.app, config, shutdown_trigger=self._hypercorn_stop.wait))
        # hypercorn binds inside serve(); give it a moment and surface bind errors.
        await asyncio.sleep(0.05)
        if self._task.done():
            self._task.result()

    async def stop(self) -> None:
        if self._uvicorn is not None:
            # Open connections get the exit timeout, alongside the server's own drain (asgi.UvicornListener.stop).
            await self._uvicorn.stop(grace_s=float(self.server.options.exit_timeout_secs))
        elif self._hypercorn_stop is not None:
            self._hypercorn_stop.set()
            if self._task is not None:
                await self._task

    def transfers(self) -> int:
        """Bodies being read and answers being written (uvicorn only: hypercorn drains on its own)."""
        return self._uvicorn.transfers() if self._uvicorn is not None else 0

    async def close(self) -> None:
        if self._uvicorn is not None:
            await self._uvicorn.close()
