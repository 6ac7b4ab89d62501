"""The OpenAI-compatible listener: its own port (--openai-port), the HTTP transport's limits.

A uvicorn listener like the KServe one (kernel.transports.asgi.UvicornListener), with the same
header size and header/body timeouts (--http-max-header-size, --http-header-timeout-secs,
--http-body-timeout-secs), bodies bounded by --http-max-input-size, JSON answers by
--http-max-json-output-size, answers not read counted in --max-held-output-bytes and cut after
--client-stall-timeout-secs, the same restricted API groups.

Shutdown: on stop it listens no more, and calls in progress (streams included) get
--exit-timeout-secs to finish. When that is spent, a call still generating is ended as a client
can tell: a stream with an error event (`"code": "server_stopping"`) and the end of its body, a
non-streamed call with a 503; its model requests are cancelled, and one warning says how many
(uvicorn's own shutdown, which would cancel the calls with a traceback each and leave their
clients a bare EOF, is given longer). A client that does not read even that is reset a moment
later, when the server closes its transports.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

from kernel.core.transport import Transport
from kernel.transports.asgi import UvicornListener
from kernel.transports.http_limits import Http1Limits, protocol_with
from kernel.transports.openai.app import OpenAIApp
from kernel.transports.restrictions import Restrictions

DEFAULT_PORT = 9000  # the port of Triton's own OpenAI frontend
# Seconds the calls ended at the exit timeout get to write their last event before they are reset.
END_WAIT_S = 1.0
# uvicorn's grace past the exit timeout: the server closes this transport (close()) before it ends.
_UVICORN_MARGIN_S = 60.0
_STOPPING = "the server is stopping and its exit timeout ({:g} s) is spent"
log = logging.getLogger("kernel.openai")


class OpenAITransport(Transport):
    service_name = "OpenAIService"

    def __init__(self, server, address: str = "0.0.0.0", port: int = DEFAULT_PORT,
                 max_input_size: int = 64 * 1024 * 1024, restricted: Optional[Restrictions] = None,
                 max_json_output_size: int = 64 * 1024 * 1024, api_key: Optional[str] = None):
        self.server = server
        self.address = address
        self.port = port
        self.app = OpenAIApp(server, max_input_size, restricted, max_json_output_size, api_key)
        # Replaced by the CLI with the --http-* limits, as for every HTTP/1.1 listener.
        self.limits = Http1Limits()
        self._uvicorn: Optional[UvicornListener] = None
        self._deadline: Optional[asyncio.TimerHandle] = None

    async def start(self) -> str:
        # Answers a client does not read are held in the connection's write buffer: counted in the
        # server's account of held answers, and cut there (as on the KServe port).
        protocol = protocol_with(self.limits, None, self.server.held_output)
        self._uvicorn = UvicornListener(self.app, self.address, self.port, "OpenAI", self.limits, protocol)
        await self._uvicorn.start()
        return f"{self.address}:{self.port}"

    async def stop(self) -> None:
        if self._uvicorn is not None:
            exit_s = float(self.server.options.exit_timeout_secs)
            self._deadline = asyncio.get_running_loop().call_later(exit_s, self._end_calls)
            await self._uvicorn.stop(grace_s=exit_s + _UVICORN_MARGIN_S)

    def transfers(self) -> int:
        return self.app.active

    def _end_calls(self) -> None:
        """The exit timeout is spent: end the calls still generating (see the module docstring)."""
        self._deadline = None
        ended = self.app.end_all(_STOPPING.format(float(self.server.options.exit_timeout_secs)))
        if ended:
            log.warning("OpenAI API: %d call%s still generating at the exit timeout ended with an error "
                        "(server_stopping)", ended, "" if ended == 1 else "s")

    async def close(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._end_calls()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + END_WAIT_S
        while self.app.streams and loop.time() < deadline:
            await asyncio.sleep(0.02)
        self.app.cut_all()
        if self._uvicorn is not None:
            await self._uvicorn.close()
        await self.app.templates.close()
