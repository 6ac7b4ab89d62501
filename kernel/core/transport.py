"""What the core asks of a transport (HTTP, gRPC, SageMaker, Vertex AI, metrics)."""

from __future__ import annotations

import abc


class Transport(abc.ABC):
    #: as tritonserver logs it, e.g. "HTTPService", "GRPCInferenceService"
    service_name: str = ""

    @abc.abstractmethod
    async def start(self) -> str:
        """Start listening; return the address it listens on ("0.0.0.0:8000")."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop accepting new requests and connections; in-flight requests finish on their own."""
