"""The OpenAI-compatible listener: its own port (--openai-port), the HTTP transport's limits.

A uvicorn listener like the KServe one (kernel.transports.asgi.UvicornListener), with the same
header size and header/body timeouts (--http-max-header-size, --http-header-timeout-secs,
--http-body-timeout-secs), bodies bounded by --http-max-input-size, JSON answers by
--http-max-json-output-size, answers not read counted in --max-held-output-bytes and cut after
--client-stall-timeout-secs, the same restricted API groups, and the same shutdown: on stop it listens no more, calls in progress (streams included)
get --exit-timeout-secs to finish, and whatever is still open after that is cut.
"""

from __future__ import annotations

from typing import Optional

from kernel.core.transport import Transport
from kernel.transports.asgi import UvicornListener
from kernel.transports.http_limits import Http1Limits, protocol_with
from kernel.transports.openai.app import OpenAIApp
from kernel.transports.restrictions import Restrictions

DEFAULT_PORT = 9000  # the port of Triton's own OpenAI frontend


class OpenAITransport(Transport):
    service_name = "OpenAIService"

    def __init__(self, server, address: str = "0.0.0.0", port: int = DEFAULT_PORT,
                 max_input_size: int = 64 * 1024 * 1024, restricted: Optional[Restrictions] = None,
                 max_json_output_size: int = 64 * 1024 * 1024):
        self.server = server
        self.address = address
        self.port = port
        self.app = OpenAIApp(server, max_input_size, restricted, max_json_output_size)
        # Replaced by the CLI with the --http-* limits, as for every HTTP/1.1 listener.
        self.limits = Http1Limits()
        self._uvicorn: Optional[UvicornListener] = None

    async def start(self) -> str:
        # Answers a client does not read are held in the connection's write buffer: counted in the
        # server's account of held answers, and cut there (as on the KServe port).
        protocol = protocol_with(self.limits, None, self.server.held_output)
        self._uvicorn = UvicornListener(self.app, self.address, self.port, "OpenAI", self.limits, protocol)
        await self._uvicorn.start()
        return f"{self.address}:{self.port}"

    async def stop(self) -> None:
        if self._uvicorn is not None:
            await self._uvicorn.stop(grace_s=float(self.server.options.exit_timeout_secs))

    def transfers(self) -> int:
        return self.app.active

    async def close(self) -> None:
        self.app.cut_all("the server is stopping and its exit timeout is spent")
        await self.app.templates.close()
