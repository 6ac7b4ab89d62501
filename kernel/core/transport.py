"""What the core asks of a transport (HTTP, gRPC, SageMaker, Vertex AI, metrics)."""

from __future__ import annotations

import abc
import socket


class Transport(abc.ABC):
    #: as tritonserver logs it, e.g. "HTTPService", "GRPCInferenceService"
    service_name: str = ""
    #: Whether it may start before the models load (Server.open): it then answers liveness while a
    #: long load runs, with readiness false. A transport whose start needs the models (a default
    #: model that must exist) says False: it starts after loading, and only its port is checked before.
    serves_while_loading: bool = True

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

    def check_port(self) -> None:
        """Raise OSError when the port start() will listen on is taken (or the address is not this
        machine's), without listening: the server checks before it loads any model, so that a
        taken port is reported in a second instead of after a long load. Transports with an
        `address` and a `port` (0: any port) are checked; others are not."""
        address, port = getattr(self, "address", None), getattr(self, "port", None)
        if not address or not port:
            return
        probe = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
        try:
            # As the listeners bind: SO_REUSEADDR, so that only a socket that listens there (not one
            # in TIME_WAIT) counts as taken.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, port))
        finally:
            probe.close()


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
