"""Helpers of `kernel serve`'s start-up (cli.serve): the standby workers to start, service failures.

Apart from cli.py, which is near the size limit, and importing nothing heavy: cli.serve starts the
standby workers (backends/python/standby.py) before it imports the server, so that the workers'
imports overlap the front's.
"""

from __future__ import annotations

import errno
from pathlib import Path

# tritonserver's name of each service in its "failed to start <name> service: ..." line.
SERVICE_NAMES = {"HTTPService": "HTTP", "GRPCInferenceService": "GRPC", "Metrics Service": "Metrics",
                 "Sagemaker HTTPService": "Sagemaker", "Vertex AI HTTPService": "Vertex AI"}
# Why a listening socket could not be made: tritonserver words them all "already in use".
_BIND_ERRNOS = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES}


def service_failure(exc) -> str:
    """The one line tritonserver logs when a service cannot start; for a port that cannot be
    listened on: `failed to start HTTP service: Unavailable - Socket '0.0.0.0:8000' already in use `
    (its trailing space included, for scripts that match the whole line)."""
    transport = exc.transport
    name = SERVICE_NAMES.get(transport.service_name, transport.service_name)
    address, port = getattr(transport, "address", None), getattr(transport, "port", None)
    if exc.errno in _BIND_ERRNOS and address is not None:
        return f"failed to start {name} service: Unavailable - Socket '{address}:{port}' already in use "
    return f"failed to start {name} service: {exc}"


def expected_workers(args) -> int:
    """Workers that loading at start-up will start (an estimate from the config files' text)."""
    from kernel.backends.python import standby

    names = None  # every model folder: modes none and poll, or explicit with --load-model=*
    if args.model_control_mode == "explicit" and "*" not in args.load_model:
        names = set(args.load_model)
    repositories = [Path(p) for p in (args.model_repository or []) if "://" not in p]
    return standby.estimate(repositories, args.model_config_name or "", names)
