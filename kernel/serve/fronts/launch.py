"""`kernel serve` with several front processes: the supervisor's server and its start.

The supervisor builds the server from the same flags as a single process would (so flags are
checked, and fail, the same way), keeps the metrics port, takes the client transports off its own
server (the fronts run them) and holds their ports meanwhile, then runs the usual start-up
(kernel.serve.startup.run) with the fronts started, served and stopped at their points in it.
"""

from __future__ import annotations

import asyncio
import logging

from kernel.serve.startup import run, service_failure

log = logging.getLogger("kernel.core.server")

# The flag of each client transport's port (a port 0 is resolved here, so every front binds the same).
_PORT_FLAGS = {"HTTPService": "--http-port", "GRPCInferenceService": "--grpc-port",
               "Sagemaker HTTPService": "--sagemaker-port", "Vertex AI HTTPService": "--vertex-ai-port",
               "OpenAIService": "--openai-port"}


async def serve_with_fronts(server, remote, args, count: int, stop: asyncio.Event) -> int:
    """Run `server` (built from `args` by the CLI) as the supervisor of `count` fronts."""
    from kernel.core.transport import TransportStartError
    from kernel.serve.fronts.supervisor import FrontSupervisor
    from kernel.transports import listen
    from kernel.transports.metrics import MetricsTransport

    metrics = [t for t in server.transports if isinstance(t, MetricsTransport)]
    client = [t for t in server.transports if not isinstance(t, MetricsTransport)]
    reserved, overrides = [], []
    try:
        for t in client:
            try:
                sock = listen.reserve(t.address, t.port, t.service_name)
            except OSError as exc:
                raise TransportStartError(t, exc) from exc
            reserved.append(sock)
            if t.port == 0:
                t.port = sock.getsockname()[1]
                flag = _PORT_FLAGS.get(t.service_name)
                if flag is not None:
                    overrides += [flag, str(t.port)]
    except TransportStartError as exc:
        for sock in reserved:
            sock.close()
        log.error("%s", service_failure(exc))
        return 1
    server.transports = metrics
    serve_argv = [*args.argv[1:], *overrides]  # (args.argv[0] is "serve")
    supervisor = FrontSupervisor(server, serve_argv, count, client, reserved)
    for t in metrics:
        t.service.others = supervisor.hub.front_metrics
    # Trace ids of BLS and relayed calls traced here stay apart from every front's (front i: i, i + N + 1, ...).
    server.tracer.forward_records(None, count + 1, count + 1)
    python = server.backends.get("python")
    if python is not None:
        python.on_restarted = lambda instance: asyncio.ensure_future(supervisor.hub.relink(instance))
    log.info("serving clients from %d front processes", count)
    return await run(server, remote, stop, fronts=supervisor)
