"""The Vertex AI endpoint: its own uvicorn server (AIP_HTTP_PORT, default 8080) in the front process's loop."""

from __future__ import annotations

from typing import Optional

from kernel.transports.restrictions import Restrictions
from kernel.core.server import Server, StartupError
from kernel.transports.cloud import CloudHttpTransport
from kernel.transports.http.app import DEFAULT_MAX_JSON_OUTPUT_SIZE
from kernel.transports.vertex.app import VertexApp, VertexSettings


class VertexAiTransport(CloudHttpTransport):
    service_name = "Vertex AI HTTPService"

    def __init__(self, server: Server, address: str = "0.0.0.0", port: int = 8080,
                 max_input_size: int = 64 * 1024 * 1024, default_model: str = "",
                 settings: Optional[VertexSettings] = None, restricted: Optional[Restrictions] = None,
                 max_json_output_size: int = DEFAULT_MAX_JSON_OUTPUT_SIZE):
        self.settings = settings if settings is not None else VertexSettings.from_env(default_model)
        super().__init__(server, address, port, max_input_size, restricted, max_json_output_size)

    def make_app(self, server: Server, http_app):
        return VertexApp(server, http_app, self.settings)

    async def start(self) -> str:
        # After the repository has loaded: the default model must be known and ready.
        try:
            self.app.check()
        except ValueError as exc:
            raise StartupError(f"failed to start Vertex AI service: Invalid argument - {exc}") from None
        return await super().start()
