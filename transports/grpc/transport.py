"""The gRPC endpoint: GRPCInferenceService on the front process's event loop.

Kernel's own HTTP/2 server (native_server.py) carries it by default. The RPC
logic lives in service.py and knows nothing of the server library, so grpclib
(grpclib_server.py) or grpcio's asyncio server (grpcio_server.py) can carry
it instead: `GrpcOptions(server_library="grpclib")`, or KERNEL_GRPC_SERVER.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import ssl
from dataclasses import dataclass
from typing import Optional

from kernel.transports.restrictions import Restrictions
from kernel.core.server import Server, StartupError
from kernel.core.transport import Transport
from kernel.transports.grpc.compression import LEVELS, level_index
from kernel.transports.grpc.http2.limits import Http2Limits
from kernel.transports.grpc.service import InferenceService
from kernel.transports.header_forward import HeaderForwarder

log = logging.getLogger("kernel.grpc")

# "native": Kernel's own HTTP/2 server (native_server.py), the default because it
# measures fastest; "grpclib" and "grpcio" carry the same service through those
# libraries (see benchmarks/results/grpc_servers.md).
SERVER_LIBRARIES = ("native", "grpclib", "grpcio")
DEFAULT_SERVER_LIBRARY = "native"


def _default_library() -> str:
    # KERNEL_GRPC_SERVER lets tests and benchmarks pick the library without a flag.
    return os.environ.get("KERNEL_GRPC_SERVER", DEFAULT_SERVER_LIBRARY)


@dataclass
class GrpcOptions:
    """tritonserver's --grpc-* settings (times in milliseconds, as on its command line)."""

    keepalive_time_ms: int = 7_200_000
    keepalive_timeout_ms: int = 20_000
    keepalive_permit_without_calls: bool = False
    http2_max_pings_without_data: int = 2
    # Ping policing (Kernel's own server and grpcio): more than this many pings too close
    # together with no data sent end the connection (0: any number).
    http2_max_ping_strikes: int = 2
    http2_min_recv_ping_interval_without_data_ms: int = 300_000
    # A graceful GOAWAY after this age, and a hard close this long after it (None: never).
    max_connection_age_ms: Optional[int] = None
    max_connection_age_grace_ms: Optional[int] = None
    # Kernel only. A request message's size: tritonserver's gRPC limit (INT32_MAX), checked
    # against the length prefix before anything is buffered.
    max_message_size: int = 2**31 - 1
    # Kernel only. What a compressed request message may inflate to (never more than
    # max_message_size): the default of --http-max-input-size, which bounds compressed HTTP bodies.
    max_decompressed_size: int = 64 * 1024 * 1024
    # Kernel only. What the partial request messages of all calls on one connection may hold
    # (one message alone may always reach max_message_size); calls past it: RESOURCE_EXHAUSTED.
    max_buffered_per_connection: int = 1 << 30
    # Kernel only. The other limits of Kernel's own HTTP/2 server (streams, header sizes,
    # windows, flood policing, timeouts); the --grpc-* fields above take precedence.
    http2: Http2Limits = dataclasses.field(default_factory=Http2Limits)
    # Triton keeps this many request/response objects for reuse; Kernel allocates
    # per request, so the value is accepted and only validated.
    infer_allocation_pool_size: int = 8
    use_ssl: bool = False
    use_ssl_mutual: bool = False  # implies use_ssl, as in tritonserver
    server_cert: str = ""
    server_key: str = ""
    root_cert: str = ""
    # Kernel only: which server carries the service (one of SERVER_LIBRARIES).
    server_library: str = dataclasses.field(default_factory=_default_library)
    # --grpc-restricted-protocol: RPC groups that need a `triton-grpc-protocol-<key>` header.
    restricted: Optional[Restrictions] = None
    # --grpc-header-forward-pattern: metadata of infer calls whose keys match become request parameters.
    header_forward_pattern: str = ""
    # --grpc-infer-response-compression-level: none, low, medium or high (compression.py). grpcio
    # applies it to the answers of every RPC (grpcio_server.py); the other servers, as
    # tritonserver, to ModelInfer and ModelStreamInfer answers only.
    infer_response_compression_level: str = "none"
    # Kernel only (its own server). After a ModelStreamInfer call's write, the responses that follow
    # within this many milliseconds leave together one interval later (stream_pacing.py says why);
    # a request's first and last responses never wait. 0: each loop turn's responses at once.
    stream_write_interval_ms: float = 1.0

    def __post_init__(self) -> None:
        if self.server_library not in SERVER_LIBRARIES:
            raise ValueError(
                f"unknown gRPC server library '{self.server_library}' (choose from {', '.join(SERVER_LIBRARIES)})"
            )
        if self.keepalive_time_ms <= 0 or self.keepalive_timeout_ms <= 0:
            raise ValueError("--grpc-keepalive-time and --grpc-keepalive-timeout must be positive")
        if self.http2_max_pings_without_data < 0:
            raise ValueError("--grpc-http2-max-pings-without-data must be >= 0")
        if self.http2_max_ping_strikes < 0 or self.http2_min_recv_ping_interval_without_data_ms < 0:
            raise ValueError("--grpc-http2-max-ping-strikes and --grpc-http2-min-recv-ping-interval-without-data "
                             "must be >= 0")
        for flag, value in (("--grpc-max-connection-age", self.max_connection_age_ms),
                            ("--grpc-max-connection-age-grace", self.max_connection_age_grace_ms)):
            if value is not None and value <= 0:
                raise ValueError(f"{flag} must be positive")
        if self.max_message_size <= 0 or self.max_decompressed_size <= 0 or self.max_buffered_per_connection <= 0:
            raise ValueError("the gRPC message size limits must be positive")
        if not 0 <= self.stream_write_interval_ms <= 1000:
            raise ValueError("--grpc-stream-write-interval-ms must be between 0 and 1000")
        if self.infer_allocation_pool_size < 0:
            raise ValueError("--grpc-infer-allocation-pool-size must be >= 0")
        if self.header_forward_pattern:
            HeaderForwarder(self.header_forward_pattern)  # ValueError for a bad regular expression
        self.infer_response_compression_level = LEVELS[level_index(self.infer_response_compression_level)]

    def http2_limits(self) -> Http2Limits:
        """The limits of Kernel's own HTTP/2 server, with the --grpc-* flags applied."""

        def seconds(ms: Optional[int]) -> Optional[float]:
            return None if ms is None else ms / 1000.0

        return dataclasses.replace(
            self.http2,
            max_ping_strikes=self.http2_max_ping_strikes,
            min_recv_ping_interval_without_data=self.http2_min_recv_ping_interval_without_data_ms / 1000.0,
            permit_pings_without_calls=self.keepalive_permit_without_calls,
            max_connection_age=seconds(self.max_connection_age_ms),
            max_connection_age_grace=seconds(self.max_connection_age_grace_ms),
        )

    @property
    def ssl_enabled(self) -> bool:
        return self.use_ssl or self.use_ssl_mutual

    @classmethod
    def from_args(cls, args) -> "GrpcOptions":
        """Build from an argparse namespace holding `grpc_<field>` attributes (missing ones keep defaults)."""
        names = {
            "keepalive_time_ms": "grpc_keepalive_time",
            "keepalive_timeout_ms": "grpc_keepalive_timeout",
            "keepalive_permit_without_calls": "grpc_keepalive_permit_without_calls",
            "http2_max_pings_without_data": "grpc_http2_max_pings_without_data",
            "http2_max_ping_strikes": "grpc_http2_max_ping_strikes",
            "http2_min_recv_ping_interval_without_data_ms": "grpc_http2_min_recv_ping_interval_without_data",
            "max_connection_age_ms": "grpc_max_connection_age",
            "max_connection_age_grace_ms": "grpc_max_connection_age_grace",
            "infer_allocation_pool_size": "grpc_infer_allocation_pool_size",
            "use_ssl": "grpc_use_ssl",
            "use_ssl_mutual": "grpc_use_ssl_mutual",
            "server_cert": "grpc_server_cert",
            "server_key": "grpc_server_key",
            "root_cert": "grpc_root_cert",
            "server_library": "grpc_server",
            "header_forward_pattern": "grpc_header_forward_pattern",
            "infer_response_compression_level": "grpc_infer_response_compression_level",
            "stream_write_interval_ms": "grpc_stream_write_interval_ms",
        }
        values = {}
        for field, attr in names.items():
            value = getattr(args, attr, None)
            if value is not None:
                values[field] = value
        restricted = getattr(args, "grpc_restricted_protocol", None)
        if restricted:
            values["restricted"] = Restrictions.parse_grpc(restricted)  # RestrictionError is a ValueError
        return cls(**values)

    def ssl_context(self) -> Optional[ssl.SSLContext]:
        """The TLS context for the listening socket, or None for plaintext.

        Raises OSError (ssl.SSLError, FileNotFoundError) for unusable files, so
        `kernel serve` fails at start-up as tritonserver does.
        """
        if not self.ssl_enabled:
            return None
        if not self.server_cert or not self.server_key:
            raise OSError("--grpc-use-ssl requires --grpc-server-cert and --grpc-server-key")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.server_cert, self.server_key)
        if self.root_cert:
            ctx.load_verify_locations(self.root_cert)
        if self.use_ssl_mutual:
            if not self.root_cert:
                raise OSError("--grpc-use-ssl-mutual requires --grpc-root-cert to verify client certificates")
            ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.set_alpn_protocols(["h2"])
        return ctx


class GrpcTransport(Transport):
    service_name = "GRPCInferenceService"

    def __init__(
        self,
        server: Server,
        address: str = "0.0.0.0",
        port: int = 8001,
        options: Optional[GrpcOptions] = None,
        **settings,
    ):
        """`settings` are GrpcOptions fields, for callers that do not build a GrpcOptions."""
        if options is None:
            options = GrpcOptions(**settings)
        elif settings:
            options = dataclasses.replace(options, **settings)
        self.server = server
        self.address = address
        self.port = port
        self.options = options
        self.service = InferenceService(server)
        self.service.restricted = options.restricted or None
        if options.header_forward_pattern:
            self.service.header_forward = HeaderForwarder(options.header_forward_pattern)
        self._impl = None
        self._stopping: Optional[asyncio.Task] = None  # grpcio's or grpclib's own graceful stop

    async def start(self) -> str:
        ssl_context = self.options.ssl_context()
        library = self.options.server_library
        if library == "native":
            from kernel.transports.grpc.native_server import NativeServer

            self._impl = NativeServer(self.service, self.options)
        elif library == "grpcio":
            from kernel.transports.grpc.grpcio_server import GrpcioServer

            self._impl = GrpcioServer(self.service, self.options)
        else:
            try:
                from kernel.transports.grpc.grpclib_server import GrpclibServer
            except ImportError as exc:
                raise StartupError(
                    f"--grpc-server grpclib needs grpclib ({exc}): pip install 'kernel-inference-server[grpclib]'"
                ) from None
            self._impl = GrpclibServer(
                self.service, _grpclib_config(self.options), self.options.infer_response_compression_level
            )
        await self._impl.start(self.address, self.port, ssl_context)
        bound = self._impl.bound_port()
        if bound:
            self.port = bound
        return f"{self.address}:{self.port}"

    async def stop(self) -> None:
        """No new connections or calls; those in progress go on (see transfers) until close().

        Kernel's own server sends GOAWAY to every connection (idle ones close at once) and lets
        calls being received, run or answered finish; grpcio and grpclib run their own graceful
        stop, bounded by the exit timeout, in the background."""
        impl = self._impl
        if impl is None or self._stopping is not None:
            return
        grace = float(getattr(getattr(self.server, "options", None), "exit_timeout_secs", 30.0))
        if self.options.server_library == "native":
            impl.stop_accepting(grace)
        else:
            self._stopping = asyncio.ensure_future(impl.stop(grace))

    def transfers(self) -> int:
        impl = self._impl
        if impl is None:
            return 0
        if self._stopping is not None:
            return 0 if self._stopping.done() else 1
        if self.options.server_library == "native":
            return impl.transfers()
        return 0

    async def close(self) -> None:
        """Cut whatever is still open (the server's exit timeout is spent)."""
        impl, self._impl = self._impl, None
        if impl is None:
            return
        stopping, self._stopping = self._stopping, None
        if stopping is not None:
            await stopping  # (bounded by the grace it was given)
        elif self.options.server_library == "native":
            await impl.close()
        else:
            await impl.stop(0)


def _grpclib_config(options: GrpcOptions):
    from grpclib.config import Configuration

    return Configuration(
        _keepalive_time=options.keepalive_time_ms / 1000.0,
        _keepalive_timeout=options.keepalive_timeout_ms / 1000.0,
        _keepalive_permit_without_calls=options.keepalive_permit_without_calls,
        _http2_max_pings_without_data=options.http2_max_pings_without_data,
    )
