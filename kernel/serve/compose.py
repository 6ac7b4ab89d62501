"""Assemble a server: the core `Server` plus what sits around it.

The core knows nothing of loading or observability; this is where they are attached: model control
with its loader (kernel.loading), the request tracer, the log settings of the logging extension
and the metric registries (kernel.observe). Transports are added by the caller (the CLI, the
in-process server), since which ones run depends on flags.
"""

from __future__ import annotations

from kernel.core.backend import Backend
from kernel.core.server import Server, ServerOptions, StartupError
from kernel.loading.control import ModelControl
from kernel.loading.loader import ModelLoader
from kernel.observe.log import LogSettings
from kernel.observe.custom_metrics import CustomMetrics
from kernel.observe.metrics import MetricsConfig
from kernel.observe.trace import Tracer
from kernel.observe.trace_settings import TraceConfig


def compose_server(options: ServerOptions, backends: dict[str, Backend]) -> Server:
    """A server for `options` with these backends, ready for transports and `start()`."""
    server = Server(options, backends)
    server.custom_metrics = CustomMetrics()
    server.metrics_config = MetricsConfig(options.metrics_config)
    server.log_settings = options.log or LogSettings(verbose=options.log_verbose)
    try:
        server.tracer = Tracer(options.trace or TraceConfig())
    except RuntimeError as exc:  # opentelemetry mode without the SDK installed
        raise StartupError(str(exc)) from None
    server.control = ModelControl(server, ModelLoader(server))
    return server
