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

    def transfers(self) -> int:
        """Bodies still being read and answers still being written on this transport.

        The server's stop waits for these as it waits for requests inside models, within
        --exit-timeout-secs: a client reading a 64 MB answer at SIGTERM gets all of it."""
        return 0

    async def close(self) -> None:
        """Cut whatever is still open: the exit timeout is spent (called after stop())."""


class TransportStartError(OSError):
    """A transport could not start (its port taken, its address not this machine's...).

    Carries the transport, so that the caller can name the service and its socket the way
    tritonserver's log line does; str() and errno stay the cause's, so callers that catch
    OSError see what they saw before."""

    def __init__(self, transport: Transport, cause: OSError):
        super().__init__(str(cause))
        self.errno = cause.errno
        self.transport = transport
        self.cause = cause
