"""Checks of `kernel serve`'s command line that need no server: ports that collide, and the model
repositories named (local folders that exist). Each failure is a StartupError in tritonserver's
words where it has some."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from kernel.core.server import StartupError


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
    for name, address, port, _ in services:
        # tritonserver takes any integer and fails later, or listens nowhere; refuse it up front.
        if not 0 <= port <= 65535:
            raise StartupError(f"{name} port {port} is out of range: a port is 0 to 65535")
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


def repository_paths(args) -> list[str]:
    if args.model_repository:
        return list(args.model_repository)
    storage = os.environ.get("AIP_STORAGE_URI", "")
    if storage:  # Vertex AI hands the model location over in the environment
        return [storage]
    # As tritonserver: no repository, no server (`make serve` names model_repo_examples/).
    raise StartupError("Invalid argument - --model-repository must be specified")


def check_local(path: str) -> None:
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", path)
    if scheme:
        where = " (from AIP_STORAGE_URI)" if path == os.environ.get("AIP_STORAGE_URI") else ""
        raise StartupError(
            f"model repository '{path}'{where}: {scheme.group(1)}:// repositories are not supported by Kernel; "
            "copy the repository to a local directory and serve that path"
        )


def check_repository(path: Path) -> None:
    """A model repository that is missing, or a file, or unreadable stops start-up naming which.

    tritonserver 2.51 says `Internal - failed to stat file /nope` for a path that does not exist and
    `Invalid argument - repository path is not a valid directory` for a file; Kernel keeps those
    words and adds what was found, and the path."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise StartupError(f"Internal - failed to stat file {path}: the model repository does not exist") from None
    except OSError as exc:
        raise StartupError(f"Internal - failed to stat file {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise StartupError(f"Invalid argument - repository path is not a valid directory: '{path}' is not a "
                           "directory")
