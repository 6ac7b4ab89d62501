"""The SageMaker endpoint: its own uvicorn server (default port 8080) in the front process's loop."""

from __future__ import annotations

from typing import Optional

from kernel.transports.restrictions import Restrictions
from kernel.core.server import Server, StartupError
from kernel.transports.cloud import CloudHttpTransport
from kernel.transports.http.app import DEFAULT_MAX_JSON_OUTPUT_SIZE
from kernel.transports.sagemaker.app import SageMakerApp, SageMakerSettings


class SageMakerTransport(CloudHttpTransport):
    service_name = "Sagemaker HTTPService"

    def __init__(self, server: Server, address: str = "0.0.0.0", port: int = 8080,
                 max_input_size: int = 64 * 1024 * 1024, settings: Optional[SageMakerSettings] = None,
                 restricted: Optional[Restrictions] = None,
                 max_json_output_size: int = DEFAULT_MAX_JSON_OUTPUT_SIZE):
        # Read the environment now, as tritonserver does when it creates the endpoint.
        self.settings = settings if settings is not None else SageMakerSettings.from_env()
        super().__init__(server, address, port, max_input_size, restricted, max_json_output_size)

    def make_app(self, server: Server, http_app):
        return SageMakerApp(server, http_app, self.settings)

    async def start(self) -> str:
        try:
            self.app.check()
        except ValueError as exc:
            raise StartupError(f"SageMaker endpoint: {exc}") from None
        return await super().start()
