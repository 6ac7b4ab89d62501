"""`kernel serve`: tritonserver's command line, for Kernel.

Flags keep tritonserver's names and value forms (`--http-port 8000` or
`--http-port=8000`, booleans as true/false). A tritonserver flag Kernel does
not implement yet is refused with a message that says so, rather than
silently ignored; a few that only tune Triton's C++ internals are accepted and
have no effect (listed in NO_EFFECT_FLAGS).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import logging
import os
import re
import signal
import sys
from pathlib import Path
from typing import Optional

from kernel.observe import log as server_log
from kernel.transports.restrictions import RestrictionError, Restrictions
from kernel.core.cache import CacheConfigError, create_cache
from kernel.core.server import Server, ServerOptions, StartupError
from kernel.serve.compose import compose_server
from kernel.observe.log import LogSettings
from kernel.observe.trace_settings import TraceConfigError, config_from_flags

log = logging.getLogger("kernel.core.server")

# Plug-ins by name: the core stays free of transport and backend imports.
BACKENDS = {"python": "kernel.backends.python:PythonBackend"}
HTTP_TRANSPORT = "kernel.transports.http:HttpTransport"
GRPC_TRANSPORT = "kernel.transports.grpc:GrpcTransport"
GRPC_OPTIONS = "kernel.transports.grpc:GrpcOptions"
METRICS_TRANSPORT = "kernel.transports.metrics:MetricsTransport"
SAGEMAKER_TRANSPORT = "kernel.transports.sagemaker:SageMakerTransport"
VERTEX_AI_TRANSPORT = "kernel.transports.vertex:VertexAiTransport"
HEADER_FORWARDER = "kernel.transports.header_forward:HeaderForwarder"

BUNDLED_REPOSITORY = Path(__file__).resolve().parent.parent / "model_repo_examples"
# Where `backend: "<name>"` finds <name>/model.py (a Python-based backend) unless
# --backend-directory says otherwise.
DEFAULT_BACKEND_DIRECTORY = Path(importlib.util.find_spec("kernel.backends").submodule_search_locations[0]) / "python_based"

# tritonserver flags that only tune Triton's own C++ thread pools and memory
# pools; Kernel has no such knobs, so they are accepted and do nothing.
NO_EFFECT_FLAGS = {
    "http-thread-count", "grpc-infer-thread-count", "model-load-thread-count", "buffer-manager-thread-count",
    "pinned-memory-pool-byte-size", "cuda-memory-pool-byte-size", "cuda-virtual-address-size",
    "min-supported-compute-capability", "allow-gpu-metrics", "model-load-retry-count",
    "grpc-max-response-pool-size", "reuse-http-port", "reuse-grpc-port", "enable-peer-access",
    "host-policy", "model-load-gpu-limit",
    "repoagent-directory", "sagemaker-thread-count", "vertex-ai-thread-count",
    "cache-directory",  # where Triton finds cache libraries; Kernel's local cache is built in
}

# tritonserver flags whose features Kernel does not have yet.
NOT_YET_FLAGS = {
    "model-namespacing",
    "grpc-http2-min-recv-ping-interval-without-data",
    "grpc-http2-max-ping-strikes", "grpc-max-connection-age", "grpc-max-connection-age-grace",
    "grpc-infer-response-compression-level",
    "rate-limit", "rate-limit-resource", "allow-client-shm",
}


def parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got '{value}'")


class _NotYet(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string}: this tritonserver flag is not supported by Kernel yet")


class _NoEffect(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        getattr(namespace, "no_effect", []).append(option_string)


def _parse_backend_config(values: list[str]) -> dict[str, dict[str, str]]:
    """--backend-config python,shm-default-byte-size=1048576 (or a global key=value)."""
    out: dict[str, dict[str, str]] = {}
    for item in values:
        backend, _, setting = item.partition(",")
        if not setting:
            backend, setting = "", backend
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --backend-config '{item}': expected <backend>,<setting>=<value>")
        out.setdefault(backend, {})[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernel", description="Kernel inference server")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="serve a Triton model repository", allow_abbrev=False)
    p.add_argument("--model-repository", "--model-store", dest="model_repository", action="append",
                   help="model repository path (repeatable); default: the bundled model_repo_examples/")
    p.add_argument("--id", default="triton", help="server identifier reported by GET /v2")
    # In a Vertex AI prediction container (AIP_MODE=PREDICTION) tritonserver serves only the
    # Vertex AI endpoint unless told otherwise.
    vertex_prediction = os.environ.get("AIP_MODE", "") == "PREDICTION"
    p.add_argument("--allow-http", type=parse_bool, default=not vertex_prediction)
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--http-max-input-size", type=int, default=64 * 1024 * 1024,
                   help="largest accepted HTTP request body in bytes (default 64MB)")
    p.add_argument("--http-header-forward-pattern", default="",
                   help="request headers whose names match this regular expression become request parameters")
    p.add_argument("--http-server", choices=("uvicorn", "hypercorn"), default="uvicorn",
                   help="Kernel only: the HTTP server library (default uvicorn with httptools)")
    p.add_argument("--allow-grpc", type=parse_bool, default=not vertex_prediction)
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--grpc-header-forward-pattern", default="",
                   help="gRPC metadata whose keys match this regular expression become request parameters")
    p.add_argument("--grpc-keepalive-time", type=int, default=7200000, help="milliseconds")
    p.add_argument("--grpc-keepalive-timeout", type=int, default=20000, help="milliseconds")
    p.add_argument("--grpc-keepalive-permit-without-calls", type=parse_bool, default=False)
    p.add_argument("--grpc-http2-max-pings-without-data", type=int, default=2)
    p.add_argument("--grpc-infer-allocation-pool-size", type=int, default=8, help="accepted; no effect")
    p.add_argument("--grpc-use-ssl", type=parse_bool, default=False)
    p.add_argument("--grpc-use-ssl-mutual", type=parse_bool, default=False)
    p.add_argument("--grpc-server-cert", default="")
    p.add_argument("--grpc-server-key", default="")
    p.add_argument("--grpc-root-cert", default="")
    p.add_argument("--grpc-server", choices=("native", "grpclib", "grpcio"), default=None,
                   help="Kernel only: the gRPC server implementation (default native)")
    p.add_argument("--allow-metrics", type=parse_bool, default=True)
    p.add_argument("--metrics-address", default=None,
                   help="default: --http-address when HTTP is allowed, else 0.0.0.0")
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--metrics-interval-ms", type=int, default=2000,
                   help="how often the per-interval metrics (CPU) are sampled")
    p.add_argument("--metrics-config", action="append", default=[],
                   help="[<group>,]<setting>=<value>: counter_latencies, summary_latencies, "
                        "summary_quantiles, histogram_latencies")
    p.add_argument("--allow-cpu-metrics", type=parse_bool, default=True)
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--log-info", type=parse_bool, default=True)
    p.add_argument("--log-warning", type=parse_bool, default=True)
    p.add_argument("--log-error", type=parse_bool, default=True)
    p.add_argument("--log-format", choices=("default", "ISO8601"), default="default")
    p.add_argument("--log-file", default=None)
    p.add_argument("--http-restricted-api", action="append", default=[], metavar="<apis>:<key>=<value>",
                   help="HTTP APIs (comma-separated) that answer only with header <key>: <value> (repeatable)")
    p.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="<apis>:<key>=<value>",
                   help="gRPC APIs that answer only with metadata triton-grpc-protocol-<key>: <value> (repeatable)")
    p.add_argument("--trace-config", action="append", default=[], metavar="[<mode>,]<setting>=<value>",
                   help="rate, level, count, mode; triton,file / triton,log-frequency (repeatable)")
    p.add_argument("--trace-file", default=None, help="deprecated: --trace-config triton,file=<path>")
    p.add_argument("--trace-level", action="append", default=[], help="deprecated: --trace-config level=<level>")
    p.add_argument("--trace-rate", default=None, help="deprecated: --trace-config rate=<rate>")
    p.add_argument("--trace-count", default=None, help="deprecated: --trace-config count=<count>")
    p.add_argument("--trace-log-frequency", default=None,
                   help="deprecated: --trace-config triton,log-frequency=<n>")
    p.add_argument("--exit-timeout-secs", type=int, default=30)
    p.add_argument("--strict-readiness", type=parse_bool, default=True)
    p.add_argument("--exit-on-error", type=parse_bool, default=True)
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument("--strict-model-config", type=parse_bool, default=False)
    p.add_argument("--model-control-mode", type=str.lower, choices=("none", "poll", "explicit"), default="none")
    p.add_argument("--load-model", action="append", default=[], metavar="<model name>",
                   help="with --model-control-mode=explicit: a model to load at start-up (repeatable; '*': all)")
    p.add_argument("--repository-poll-secs", type=int, default=15,
                   help="with --model-control-mode=poll: seconds between looks at the model repositories")
    p.add_argument("--model-config-name", default=None,
                   help="use <model>/configs/<name>.pbtxt instead of config.pbtxt where it exists")
    p.add_argument("--backend-config", action="append", default=[])
    p.add_argument("--cache-config", action="append", default=[], metavar="<cache name>,<setting>=<value>",
                   help="the response cache: local,size=<bytes> (repeatable)")
    p.add_argument("--response-cache-byte-size", type=int, default=None,
                   help="deprecated: --cache-config local,size=<bytes>")
    p.add_argument("--backend-directory", default=str(DEFAULT_BACKEND_DIRECTORY),
                   help="where Python-based backends (<name>/model.py) are found "
                        "(default: the python_based/ folder of kernel.backends in the installed package)")
    p.add_argument("--allow-sagemaker", type=parse_bool, default=False,
                   help="serve the SageMaker endpoint (/ping, /invocations, /models)")
    p.add_argument("--sagemaker-port", type=int, default=8080)
    p.add_argument("--sagemaker-safe-port-range", type=_port_range, default=None, metavar="<low>-<high>",
                   help="ports the other endpoints may use when SageMaker is allowed")
    p.add_argument("--allow-vertex-ai", type=parse_bool, default=vertex_prediction,
                   help="serve the Vertex AI endpoint (default: true when AIP_MODE=PREDICTION)")
    p.add_argument("--vertex-ai-port", type=int, default=os.environ.get("AIP_HTTP_PORT", "8080"),
                   help="default: AIP_HTTP_PORT, or 8080")
    p.add_argument("--vertex-ai-default-model", default="",
                   help="the model AIP_PREDICT_ROUTE serves (needed when the repository has several)")
    p.set_defaults(no_effect=[])
    for flag in sorted(NO_EFFECT_FLAGS):
        p.add_argument(f"--{flag}", action=_NoEffect, help=argparse.SUPPRESS)
    for flag in sorted(NOT_YET_FLAGS):
        p.add_argument(f"--{flag}", action=_NotYet, nargs="?", help=argparse.SUPPRESS)
    return parser


def _port_range(value: str) -> tuple[int, int]:
    low, sep, high = value.partition("-")
    try:
        if not sep:
            raise ValueError
        return int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected <integer>-<integer>, got '{value}'") from None


def check_ports(args) -> None:
    """Refuse endpoint ports that collide, or that fall outside --sagemaker-safe-port-range."""
    services = []  # (name, address, port, allowed range for the others or None)
    if args.allow_http:
        services.append(("HTTP", args.http_address, args.http_port, None))
    if args.allow_grpc:
        services.append(("GRPC", args.grpc_address, args.grpc_port, None))
    if args.allow_metrics:
        services.append(("metrics", args.metrics_address, args.metrics_port, None))
    if args.allow_sagemaker:
        services.append(("SageMaker", "0.0.0.0", args.sagemaker_port, args.sagemaker_safe_port_range))
    if args.allow_vertex_ai:
        services.append(("Vertex AI", "0.0.0.0", args.vertex_ai_port, None))
    for i, (name, address, port, allowed) in enumerate(services):
        others = services if allowed is not None else services[i + 1:]
        for other in others:
            if other is services[i] or other[1] != address:
                continue
            if allowed is not None and not allowed[0] <= other[2] <= allowed[1]:
                raise StartupError(
                    f"The server cannot listen to {other[0]} requests at port {other[2]}, "
                    f"allowed port range is [{allowed[0]}, {allowed[1]}]"
                )
            if other[2] == port:
                raise StartupError(
                    f"The server cannot listen to {name} requests and {other[0]} requests "
                    f"at the same address and port {address}:{port}"
                )


def _repository_paths(args) -> list[str]:
    if args.model_repository:
        return list(args.model_repository)
    storage = os.environ.get("AIP_STORAGE_URI", "")
    if storage:  # Vertex AI hands the model location over in the environment
        return [storage]
    return [str(BUNDLED_REPOSITORY)]


def _check_local(path: str) -> None:
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", path)
    if scheme:
        where = " (from AIP_STORAGE_URI)" if path == os.environ.get("AIP_STORAGE_URI") else ""
        raise StartupError(
            f"model repository '{path}'{where}: {scheme.group(1)}:// repositories are not supported by Kernel; "
            "copy the repository to a local directory and serve that path"
        )


def _parse_metrics_config(values: list[str]) -> dict[str, str]:
    """--metrics-config summary_latencies=true (global group) or <group>,<setting>=<value>."""
    out: dict[str, str] = {}
    for item in values:
        group, _, setting = item.partition(",") if "=" not in item.split(",", 1)[0] else ("", "", item)
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --metrics-config '{item}': expected [<group>,]<setting>=<value>")
        if not group:
            out[key.strip()] = value.strip()
    return out


def _parse_cache_config(values: list[str], byte_size: Optional[int]) -> dict[str, dict[str, str]]:
    """--cache-config <cache name>,<setting>=<value> (repeatable) and the deprecated
    --response-cache-byte-size, as tritonserver reads them; raises StartupError for what it refuses."""
    out: dict[str, dict[str, str]] = {}
    for item in values:
        name, _, setting = item.partition(",")
        key, sep, value = setting.partition("=")
        if not name or not sep or not key:
            raise StartupError(
                f"No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got {item}")
        out.setdefault(name, {})[key] = value
    if byte_size is not None:
        log.warning("'--response-cache-byte-size' has been deprecated! This will default to the 'local' cache "
                    "implementation with the provided byte size for its config. Please use '--cache-config' "
                    "instead. The equivalent --cache-config CLI args would be: '--cache-config=local,size=%d'",
                    byte_size)
        out.setdefault("local", {})["size"] = str(byte_size)
    try:
        create_cache(out)  # refuse bad settings before anything starts
    except CacheConfigError as exc:
        raise StartupError(str(exc)) from None
    return out


def _check_model_control(args) -> str:
    """tritonserver's checks of the model control flags; the problem, or '' when there is none."""
    if args.load_model and args.model_control_mode != "explicit":
        return "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
    if args.model_config_name is not None and not args.model_config_name:
        return "Error: empty argument for --model-config-name"
    if args.repository_poll_secs < 0:
        return "Error: --repository-poll-secs must be >= 0"
    return ""


def _load(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def build_server(args) -> Server:
    paths = _repository_paths(args)
    for r in paths:
        _check_local(r)
    if args.metrics_address is None:  # as tritonserver: the HTTP address, when there is one
        args.metrics_address = args.http_address if args.allow_http else "0.0.0.0"
    check_ports(args)
    repos = [Path(r) for r in paths]
    for r in repos:
        if not r.is_dir():
            raise StartupError(f"failed to stat model repository path '{r}': not a directory")
    backend_config = _parse_backend_config(args.backend_config)
    try:
        trace_config = config_from_flags(
            args.trace_config, args.trace_file, args.trace_level, args.trace_rate, args.trace_count,
            args.trace_log_frequency,
        )
        http_restricted = Restrictions.parse_http(args.http_restricted_api)
    except (TraceConfigError, RestrictionError) as exc:
        raise StartupError(str(exc)) from None
    log_settings = LogSettings(
        file=args.log_file or "", info=args.log_info, warning=args.log_warning, error=args.log_error,
        verbose=args.log_verbose, format=args.log_format,
    )
    options = ServerOptions(
        model_repositories=repos,
        server_id=args.id,
        exit_timeout_secs=args.exit_timeout_secs,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        disable_auto_complete_config=args.disable_auto_complete_config,
        strict_model_config=args.strict_model_config,
        backend_config=backend_config,
        log_verbose=args.log_verbose,
        backend_directory=Path(args.backend_directory),
        metrics_config=_parse_metrics_config(args.metrics_config),
        model_control_mode=args.model_control_mode,
        startup_models=list(args.load_model),
        repository_poll_secs=args.repository_poll_secs if args.model_control_mode == "poll" else 0,
        model_config_name=args.model_config_name or "",
        trace=trace_config,
        log=log_settings,
        cache_config=_parse_cache_config(args.cache_config, args.response_cache_byte_size),
    )
    backends = {}
    worker_log = {
        "verbose": args.log_verbose, "info": args.log_info, "warning": args.log_warning,
        "error": args.log_error, "format": args.log_format, "file": args.log_file or "",
    }
    for name, target in BACKENDS.items():
        backends[name] = _load(target)(backend_config.get(name, {}), worker_log)
    server = compose_server(options, backends)
    if args.allow_http:
        server.transports.append(
            _load(HTTP_TRANSPORT)(server, args.http_address, args.http_port, args.http_max_input_size, args.http_server,
                                  restricted=http_restricted or None)
        )
        if args.http_header_forward_pattern:
            try:
                server.transports[-1].app.header_forward = _load(HEADER_FORWARDER)(args.http_header_forward_pattern)
            except ValueError as exc:
                raise StartupError(str(exc)) from None
    if args.allow_grpc:
        try:
            options = _load(GRPC_OPTIONS).from_args(args)
        except ValueError as exc:
            raise StartupError(f"invalid gRPC option: {exc}") from None
        server.transports.append(_load(GRPC_TRANSPORT)(server, args.grpc_address, args.grpc_port, options=options))
    if args.allow_metrics:
        server.transports.append(
            _load(METRICS_TRANSPORT)(server, args.metrics_address, args.metrics_port,
                                     interval_ms=args.metrics_interval_ms, cpu_metrics=args.allow_cpu_metrics)
        )
    if args.allow_sagemaker:
        server.transports.append(
            _load(SAGEMAKER_TRANSPORT)(server, "0.0.0.0", args.sagemaker_port, args.http_max_input_size,
                                       restricted=http_restricted or None)
        )
    if args.allow_vertex_ai:
        server.transports.append(
            _load(VERTEX_AI_TRANSPORT)(server, "0.0.0.0", args.vertex_ai_port, args.http_max_input_size,
                                       args.vertex_ai_default_model, restricted=http_restricted or None)
        )
    return server


async def serve(args) -> int:
    server = build_server(args)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        await server.start_transports()
    except (StartupError, OSError) as exc:
        log.error("error: creating server: %s", exc)
        await server.stop()
        return 1
    await stop.wait()
    log.info("Received signal, shutting down")
    await server.stop()
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    server_log.configure(args.log_verbose, args.log_info, args.log_warning, args.log_error,
                         args.log_format, args.log_file)
    for flag in args.no_effect:
        log.warning("%s is accepted for compatibility with tritonserver and has no effect in Kernel", flag)
    problem = _check_model_control(args)
    if problem:
        log.error("%s", problem)
        return 1
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(serve(args))
    try:
        return uvloop.run(serve(args))
    except StartupError as exc:
        log.error("error: creating server: %s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
