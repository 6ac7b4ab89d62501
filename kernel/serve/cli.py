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
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Optional

from kernel.observe import log as server_log
from kernel.transports.restrictions import RestrictionError, Restrictions
from kernel.serve.flags import (
    FLAG_GROUPS, FLAG_KINDS, HELP_GROUPS, HelpFormatter, KernelArgumentParser, choice, flag_adder,
    parse_backend_setting, parse_bool, parse_float, parse_front_processes, parse_int, parse_int64, parse_int_text,
    parse_metrics_setting, parse_port_range, parse_verbose_level,
)
from kernel import __version__
from kernel.observe.log import LOG_FORMATS, LogSettings
from kernel.serve.startup import StartupInterrupted, expected_workers, run, signals_interrupt, stop_on_signals
from kernel.serve import memory, openai_api

# The server itself (kernel.core.server, the config and loading code, numpy, protobuf) is imported
# by the functions that use it, not here: `main` first starts the standby workers
# (backends/python/standby.py), so that they do their imports while the front does its own.

log = logging.getLogger("kernel.core.server")

# Where `backend: "<name>"` finds <name>/model.py (a Python-based backend) unless
# --backend-directory says otherwise.
DEFAULT_BACKEND_DIRECTORY = Path(importlib.util.find_spec("kernel.backends").submodule_search_locations[0]) / "python_based"

# tritonserver flags that only tune Triton's own C++ thread pools and memory
# pools; Kernel has no such knobs, so they are accepted and do nothing.
NO_EFFECT_FLAGS = {
    "http-thread-count", "grpc-infer-thread-count", "model-load-thread-count", "buffer-manager-thread-count",
    "pinned-memory-pool-byte-size", "cuda-memory-pool-byte-size", "cuda-virtual-address-size",
    "min-supported-compute-capability", "model-load-retry-count",
    "grpc-max-response-pool-size", "reuse-http-port", "reuse-grpc-port", "enable-peer-access",
    "host-policy", "model-load-gpu-limit",
    "repoagent-directory", "sagemaker-thread-count", "vertex-ai-thread-count",
    "cache-directory",  # where Triton finds cache libraries; Kernel's local cache is built in
}

# tritonserver flags whose features Kernel does not have yet.
NOT_YET_FLAGS = {
    "model-namespacing",
    "rate-limit", "rate-limit-resource", "allow-client-shm",
}


# The value of a not-yet flag that asks for nothing Kernel lacks (tritonserver's default, feature
# off): a start-up script that spells the default out still starts.
NOT_YET_DEFAULTS = {"model-namespacing": "false", "rate-limit": "off"}


class _NotYet(argparse.Action):
    """Refuses a tritonserver flag Kernel does not implement, unless it names the feature's off value."""

    def __call__(self, parser, namespace, values, option_string=None):
        flag = self.option_strings[0]
        default = NOT_YET_DEFAULTS.get(flag[2:])
        if values is not None and default is not None:
            kind = FLAG_KINDS.get(flag[2:], str)
            try:
                value = kind(values)
            except argparse.ArgumentTypeError as exc:
                parser.error(f"argument {flag}: {exc}")
            if (value.lower() if isinstance(value, str) else value) == kind(default):
                return
        parser.error(f"{option_string}: this tritonserver flag is not supported by Kernel yet")


class _NoEffect(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        getattr(namespace, "no_effect", []).append(option_string)


def _parse_backend_config(values: list[str]) -> dict[str, dict[str, str]]:
    """--backend-config python,shm-default-byte-size=1048576 (or a global key=value), each value
    already checked by parse_backend_setting."""
    out: dict[str, dict[str, str]] = {}
    for item in values:
        backend, _, setting = item.partition(",") if "," in item.split("=", 1)[0] else ("", "", item)
        key, _, value = setting.partition("=")
        out.setdefault(backend, {})[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    """`kernel serve`'s flags, in tritonserver's --help groups, each with its default and one line of help.

    Prefixes of a flag are accepted (`--log-verb=2`) and an ambiguous one is refused, as
    tritonserver's getopt_long does."""
    parser = KernelArgumentParser(prog="kernel", description="Kernel inference server")
    parser.add_argument("--version", action="version", version=f"kernel {__version__}",
                        help="print Kernel's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=KernelArgumentParser)
    p = sub.add_parser(
        "serve", help="serve a Triton model repository", formatter_class=HelpFormatter, usage="kernel serve [options]",
        description="Serve Triton Python-backend model repositories with tritonserver's flags.",
    )
    g = {title: p.add_argument_group(title) for title in HELP_GROUPS}
    # In a Vertex AI prediction container (AIP_MODE=PREDICTION) tritonserver serves only the
    # Vertex AI endpoint unless told otherwise.
    vertex_prediction = os.environ.get("AIP_MODE", "") == "PREDICTION"

    a = flag_adder(g["Server"])
    a("--id", default="triton", help="server identifier reported by GET /v2")
    a("--exit-timeout-secs", type=parse_int, default=30,
      help="seconds to wait for in-flight requests at shutdown")
    a("--allow-remote-binding", type=parse_bool, default=False,
      help="Kernel only: processes of this user on this host may bind models (PyTriton's RemoteTriton)")
    a("--max-held-output-bytes", type=parse_int64, default=1 << 30,
      help="Kernel only: answers not yet read by their clients, all connections together; past it the "
           "longest-stalled readers are cut and new requests get 503")
    a("--max-held-input-bytes", type=parse_int64, default=1 << 30,
      help="Kernel only: partly received request bodies and messages, all connections together")
    a("--client-stall-timeout-secs", type=parse_float, default=60.0,
      help="Kernel only: seconds a client may hold an answer or a partial request without progress")
    a("--front-processes", type=parse_front_processes, default="auto", metavar="<N|auto>",
      help="Kernel only: processes that serve clients, all on the same ports, in front of one set of model "
           "instances; auto: about a third of the CPUs this process may use (1 below 6)")

    a = flag_adder(g["Logging"])
    a("--log-verbose", type=parse_verbose_level, default=0,
      help="verbose logging level; 0 disables verbose logging (true/false mean 1/0)")
    a("--log-info", type=parse_bool, default=True, help="enable/disable info-level logging")
    a("--log-warning", type=parse_bool, default=True,
      help="enable/disable warning-level logging")
    a("--log-error", type=parse_bool, default=True, help="enable/disable error-level logging")
    a("--log-format", type=choice("--log-format", LOG_FORMATS), default="default", metavar="{" + ",".join(LOG_FORMATS) + "}",
      help="log line layout: tritonserver's default or ISO8601, or Kernel's json (one object per line)")
    a("--log-file", default=None, help="append the log to this file instead of writing it to stderr")

    a = flag_adder(g["Model Repository"])
    a("--model-repository", "--model-store", dest="model_repository", action="append",
      help="model repository path (repeatable); default: AIP_STORAGE_URI; required otherwise")
    a("--exit-on-error", type=parse_bool, default=True,
      help="exit when a model fails to load at start-up")
    a("--disable-auto-complete-config", action="store_true",
      help="do not let models complete their configuration (auto_complete_config)")
    a("--strict-readiness", type=parse_bool, default=True,
      help="ready only when every model is ready (false: ready once the server is live)")
    a("--model-control-mode", type=choice("--model-control-mode", ("none", "poll", "explicit"), fold_case=True),
      default="none", metavar="{none,poll,explicit}", help="how models are loaded and unloaded")
    a("--repository-poll-secs", type=parse_int, default=15,
      help="with --model-control-mode=poll: seconds between looks at the model repositories")
    a("--load-model", action="append", default=[], metavar="<model name>",
      help="with --model-control-mode=explicit: a model to load at start-up (repeatable; '*': all)")
    a("--model-config-name", default=None,
      help="use <model>/configs/<name>.pbtxt instead of config.pbtxt where it exists")

    a = flag_adder(g["HTTP"])
    a("--allow-http", type=parse_bool, default=not vertex_prediction,
      help="serve KServe v2 over HTTP (default false when AIP_MODE=PREDICTION)")
    a("--http-address", default="0.0.0.0", help="address the HTTP endpoint listens on")
    a("--http-port", type=parse_int, default=8000, help="port the HTTP endpoint listens on")
    a("--http-header-forward-pattern", default="",
      help="request headers whose names match this regular expression become request parameters")
    a("--http-restricted-api", action="append", default=[], metavar="<apis>:<key>=<value>",
      help="HTTP APIs (comma-separated) that answer only with header <key>: <value> (repeatable)")
    a("--http-max-input-size", type=parse_int64, default=64 * 1024 * 1024,
      help="Kernel only: the largest accepted HTTP request body in bytes")
    a("--http-max-json-output-size", type=parse_int64, default=64 * 1024 * 1024,
      help="Kernel only: the most bytes an HTTP answer's JSON may take; larger outputs must be asked for "
           "as binary data (400 past it)")
    a("--http-server", type=choice("--http-server", ("uvicorn", "hypercorn")), default="uvicorn",
      metavar="{uvicorn,hypercorn}", help="Kernel only: the HTTP server library")
    a("--http-max-header-size", type=parse_int, default=64 * 1024,
      help="Kernel only: the most bytes a request line and headers may take (431 past it)")
    a("--http-header-timeout-secs", type=parse_float, default=30.0,
      help="Kernel only: seconds a client has to send a request's headers (408 past it)")
    a("--http-body-timeout-secs", type=parse_float, default=60.0,
      help="Kernel only: seconds a request body may pause before the connection is closed")
    openai_api.add_flags(a)

    a = flag_adder(g["GRPC"])
    a("--allow-grpc", type=parse_bool, default=not vertex_prediction,
      help="serve KServe v2 over gRPC (default false when AIP_MODE=PREDICTION)")
    a("--grpc-address", default="0.0.0.0", help="address the gRPC endpoint listens on")
    a("--grpc-port", type=parse_int, default=8001, help="port the gRPC endpoint listens on")
    a("--grpc-header-forward-pattern", default="",
      help="gRPC metadata whose keys match this regular expression become request parameters")
    a("--grpc-infer-allocation-pool-size", type=parse_int, default=8, help="accepted; no effect in Kernel")
    a("--grpc-use-ssl", type=parse_bool, default=False, help="serve gRPC over TLS")
    a("--grpc-use-ssl-mutual", type=parse_bool, default=False,
      help="serve gRPC over TLS and require client certificates")
    a("--grpc-server-cert", default="", help="the server's certificate file (PEM)")
    a("--grpc-server-key", default="", help="the server's private key file (PEM)")
    a("--grpc-root-cert", default="", help="the CA certificate that client certificates must chain to")
    a("--grpc-keepalive-time", type=parse_int, default=7200000, help="milliseconds between keepalive pings")
    a("--grpc-keepalive-timeout", type=parse_int, default=20000,
      help="milliseconds to wait for a keepalive ping's answer")
    a("--grpc-keepalive-permit-without-calls", type=parse_bool, default=False,
      help="allow keepalive pings while no call is open")
    a("--grpc-http2-max-pings-without-data", type=parse_int, default=2,
      help="pings the server sends without data before it waits for data")
    a("--grpc-http2-min-recv-ping-interval-without-data", type=parse_int, default=300000,
      help="milliseconds: a client ping sooner than this after the last, with no data sent, is a strike")
    a("--grpc-http2-max-ping-strikes", type=parse_int, default=2,
      help="ping strikes before the connection is closed with GOAWAY (0: no limit)")
    a("--grpc-max-connection-age", type=parse_int, default=None,
      help="milliseconds a connection may live before a graceful GOAWAY (default: no limit)")
    a("--grpc-max-connection-age-grace", type=parse_int, default=None,
      help="milliseconds after the GOAWAY of --grpc-max-connection-age before the connection is closed")
    a("--grpc-restricted-protocol", action="append", default=[], metavar="<apis>:<key>=<value>",
      help="gRPC APIs that answer only with metadata triton-grpc-protocol-<key>: <value> (repeatable)")
    # tritonserver reads the level in any case and names the flag with underscores when it refuses one.
    levels = ("none", "low", "medium", "high")  # transports/grpc/compression.py LEVELS
    a("--grpc-infer-response-compression-level", default="none", metavar="{" + ",".join(levels) + "}",
      type=choice("--grpc_infer_response_compression_level", levels, fold_case=True),
      help="compression of ModelInfer and ModelStreamInfer answers: the level picks gzip or deflate among "
           "the algorithms the client accepts (grpc-accept-encoding)")
    a("--grpc-server", type=choice("--grpc-server", ("native", "grpclib", "grpcio")), default=None,
      metavar="{native,grpclib,grpcio}", help="Kernel only: the gRPC server implementation (default: native)")
    a("--grpc-stream-write-interval-ms", type=parse_float, default=1.0, metavar="<ms>",
      help="Kernel only: a ModelStreamInfer call's response that comes within this many milliseconds of its last "
           "write waits that long, joined by those that follow, and they leave in one write; a request's first "
           "and last responses never wait (0: off)")

    a = flag_adder(g["Sagemaker"])
    a("--allow-sagemaker", type=parse_bool, default=False,
      help="serve the SageMaker endpoint (/ping, /invocations, /models)")
    a("--sagemaker-port", type=parse_int, default=8080, help="port the SageMaker endpoint listens on")
    a("--sagemaker-safe-port-range", type=parse_port_range, default=None, metavar="<low>-<high>",
      help="ports the other endpoints may use when SageMaker is allowed")

    a = flag_adder(g["Vertex"])
    a("--allow-vertex-ai", type=parse_bool, default=vertex_prediction,
      help="serve the Vertex AI endpoint (default true when AIP_MODE=PREDICTION)")
    a("--vertex-ai-port", type=parse_int, default=os.environ.get("AIP_HTTP_PORT") or "8080",
      help="port the Vertex AI endpoint listens on (default AIP_HTTP_PORT, or 8080)")
    a("--vertex-ai-default-model", default="",
      help="the model AIP_PREDICT_ROUTE serves (needed when the repository has several)")

    a = flag_adder(g["Metrics"])
    a("--allow-metrics", type=parse_bool, default=True,
      help="serve Prometheus metrics on --metrics-port")
    a("--allow-cpu-metrics", type=parse_bool, default=True,
      help="collect CPU and memory utilisation metrics")
    a("--allow-gpu-metrics", type=parse_bool, default=True,
      help="report nv_gpu_* metrics through NVML where there are GPUs (nvidia-ml-py, the [gpu] extra)")
    a("--metrics-address", default=None, help="address of the metrics endpoint (default: --http-address, "
      "or 0.0.0.0 without HTTP)")
    a("--metrics-port", type=parse_int, default=8002, help="port the metrics endpoint listens on")
    a("--metrics-interval-ms", type=parse_float, default=2000.0,
      help="milliseconds between samples of the per-interval metrics (CPU)")
    a("--metrics-config", action="append", default=[], type=parse_metrics_setting, metavar="<setting>=<value>",
      help="counter_latencies, summary_latencies, summary_quantiles, histogram_latencies (repeatable)")

    a = flag_adder(g["Tracing"])
    a("--trace-config", action="append", default=[], metavar="[<mode>,]<setting>=<value>",
      help="rate, level, count, mode (triton or opentelemetry); triton,file / triton,log-frequency; "
           "opentelemetry,url / resource / bsp_max_queue_size / bsp_schedule_delay / bsp_max_export_batch_size "
           "(repeatable)")

    a = flag_adder(g["Backend"])
    a("--backend-directory", default=str(DEFAULT_BACKEND_DIRECTORY),
      help="where Python-based backends (<name>/model.py) are found")
    a("--backend-config", action="append", default=[], type=parse_backend_setting,
      metavar="[<backend>,]<setting>=<value>",
      help="a backend setting, e.g. python,shm-default-byte-size=1048576 (repeatable)")

    a = flag_adder(g["Response Cache"])
    a("--cache-config", action="append", default=[], metavar="<cache name>,<setting>=<value>",
      help="the response cache: local,size=<bytes>, or redis,host=<host> and redis,port=<port> (also user, "
           "password, db, connect_timeout, socket_timeout, pool_size, wait_timeout, cert, key, cacert, "
           "cacert_dir) (repeatable)")

    a = flag_adder(g["DEPRECATED"])
    a("--response-cache-byte-size", type=parse_int64, default=None,
      help="deprecated: --cache-config local,size=<bytes>")
    a("--strict-model-config", type=parse_bool, default=False,
      help="deprecated: the opposite of auto-completing model configurations")
    a("--trace-file", default=None, help="deprecated: --trace-config triton,file=<path>")
    a("--trace-level", action="append", default=[], help="deprecated: --trace-config level=<level>")
    a("--trace-rate", type=parse_int_text, default=None, help="deprecated: --trace-config rate=<rate>")
    a("--trace-count", type=parse_int_text, default=None, help="deprecated: --trace-config count=<count>")
    a("--trace-log-frequency", type=parse_int_text, default=None,
      help="deprecated: --trace-config triton,log-frequency=<n>")

    p.set_defaults(no_effect=[])
    for flag in sorted(NO_EFFECT_FLAGS):
        flag_adder(g[FLAG_GROUPS.get(flag, "Memory/Device Management")])(
            f"--{flag}", action=_NoEffect, type=FLAG_KINDS.get(flag, str),
            help="accepted for compatibility with tritonserver; no effect in Kernel")
    for flag in sorted(NOT_YET_FLAGS):
        flag_adder(g[FLAG_GROUPS.get(flag, "Server")])(
            f"--{flag}", action=_NotYet, nargs="?",
            help="not supported by Kernel yet (refused)")
    return parser


def _parse_metrics_config(values: list[str]) -> dict[str, str]:
    """--metrics-config summary_latencies=true, each value already checked by parse_metrics_setting."""
    out: dict[str, str] = {}
    for item in values:
        key, _, value = item.partition("=")
        out[key.strip()] = value.strip()
    return out


def _parse_cache_config(values: list[str], byte_size: Optional[int]) -> dict[str, dict[str, str]]:
    """--cache-config <cache name>,<setting>=<value> (repeatable) and the deprecated
    --response-cache-byte-size, as tritonserver reads them; raises StartupError for what it refuses."""
    from kernel.core.cache import CacheConfigError, create_cache
    from kernel.core.server import StartupError

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


def build_server(args) -> "Server":
    """The server `kernel serve` flags describe: backends, core, and the transports the flags turn on.

    Transports are imported only when turned on (start-up time); the imports are written out so the
    arrows from composition to each transport and backend stay visible.
    """
    from kernel.backends.python import PythonBackend
    from kernel.core.server import ServerOptions, StartupError
    from kernel.serve import checks
    from kernel.observe.trace_settings import TraceConfigError, config_from_flags
    from kernel.serve.compose import compose_server
    from kernel.transports.http_limits import Http1Limits

    paths = checks.repository_paths(args)
    for r in paths:
        checks.check_local(r)
    if args.metrics_address is None:  # as tritonserver: the HTTP address, when there is one
        args.metrics_address = args.http_address if args.allow_http else "0.0.0.0"
    checks.check_ports(args)
    repos = [Path(r) for r in paths]
    for r in repos:
        checks.check_repository(r)
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
        max_held_output_bytes=args.max_held_output_bytes,
        max_held_input_bytes=args.max_held_input_bytes,
        client_stall_timeout_secs=args.client_stall_timeout_secs,
    )
    backends = {}
    worker_log = {
        "verbose": args.log_verbose, "info": args.log_info, "warning": args.log_warning,
        "error": args.log_error, "format": args.log_format, "file": args.log_file or "",
    }
    backends["python"] = PythonBackend(backend_config.get("python", {}), worker_log)
    server = compose_server(options, backends)
    if args.allow_http:
        from kernel.transports.header_forward import HeaderForwarder
        from kernel.transports.http import HttpTransport

        server.transports.append(
            HttpTransport(server, args.http_address, args.http_port, args.http_max_input_size, args.http_server,
                          restricted=http_restricted or None, max_json_output_size=args.http_max_json_output_size)
        )
        if args.http_header_forward_pattern:
            try:
                server.transports[-1].app.header_forward = HeaderForwarder(args.http_header_forward_pattern)
            except ValueError as exc:
                raise StartupError(str(exc)) from None
    if args.allow_grpc:
        from kernel.transports.grpc import GrpcOptions, GrpcTransport

        try:
            options = GrpcOptions.from_args(args)
        except ValueError as exc:
            raise StartupError(f"invalid gRPC option: {exc}") from None
        server.transports.append(GrpcTransport(server, args.grpc_address, args.grpc_port, options=options))
    if args.allow_metrics:
        from kernel.transports.metrics import MetricsTransport

        server.transports.append(
            MetricsTransport(server, args.metrics_address, args.metrics_port,
                             interval_ms=args.metrics_interval_ms, cpu_metrics=args.allow_cpu_metrics,
                             gpu_metrics=args.allow_gpu_metrics)
        )
    if args.allow_sagemaker:
        from kernel.transports.sagemaker import SageMakerTransport

        server.transports.append(
            SageMakerTransport(server, "0.0.0.0", args.sagemaker_port, args.http_max_input_size,
                               restricted=http_restricted or None, max_json_output_size=args.http_max_json_output_size)
        )
    if args.allow_vertex_ai:
        from kernel.transports.vertex import VertexAiTransport

        server.transports.append(
            VertexAiTransport(server, "0.0.0.0", args.vertex_ai_port, args.http_max_input_size,
                              args.vertex_ai_default_model, restricted=http_restricted or None,
                              max_json_output_size=args.http_max_json_output_size)
        )
    openai = openai_api.openai_transport(server, args, http_restricted or None)
    if openai is not None:
        server.transports.append(openai)
    try:
        http_limits = Http1Limits(args.http_max_header_size, args.http_header_timeout_secs, args.http_body_timeout_secs)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    for t in server.transports:
        if isinstance(getattr(t, "limits", None), Http1Limits):  # every HTTP/1.1 listener: KServe, SageMaker, Vertex AI
            t.limits = http_limits
    return server


async def serve(args) -> int:
    from kernel.backends.python import standby

    # Signals first: a Ctrl-C or SIGTERM from here on stops the server, however far start-up is.
    stop = stop_on_signals()
    # Then, before the imports below (~0.3 s): the workers the repository will need start now and
    # import numpy & co. on the other cores while the front imports the server.
    await standby.prestart(expected_workers(args))
    try:
        return await _serve(args, stop)
    except StartupInterrupted:  # stopped while the server was being built: nothing to stop
        return 0
    finally:
        standby.release()


async def _serve(args, stop: asyncio.Event) -> int:
    from kernel.serve.fronts import count

    fronts = count.resolve(args.front_processes) if getattr(args, "argv", None) is not None else 1
    single = count.single_front_reason(args) if fronts > 1 else ""
    if single:
        if args.front_processes != "auto":
            log.warning("--front-processes %d: one front process serves: %s", fronts, single)
        fronts = 1
    with signals_interrupt(stop):  # the imports below hold the loop; a signal still stops at once
        server = build_server(args)
        if fronts > 1:
            from kernel.serve.fronts.launch import serve_with_fronts
        remote = None
        if args.allow_remote_binding:  # PyTriton's remote binding (the callable backend, msgspec, protobuf)
            from kernel.serve.remote import remote_binding_host

            remote = remote_binding_host(server, args)
    if fronts > 1:
        return await serve_with_fronts(server, remote, args, fronts, stop)
    return await run(server, remote, stop)


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what front processes start with (fronts/launch.py)
    memory.return_large_buffers()
    server_log.configure(args.log_verbose, args.log_info, args.log_warning, args.log_error,
                         args.log_format, args.log_file, role=server_log.SERVE)
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
    except Exception as exc:
        from kernel.core.server import StartupError

        if not isinstance(exc, StartupError):
            raise
        log.error("error: creating server: %s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
