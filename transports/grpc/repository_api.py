"""The model repository extension's gRPC parameters (ModelRepositoryParameter maps) in core form."""

from __future__ import annotations

from typing import Optional

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.backend import FILE_PREFIX


def load_parameters(params) -> tuple[Optional[str], dict[str, bytes]]:
    """RepositoryModelLoad's `config` (string_param) and `file:<path>` (bytes_param) parameters."""
    config: Optional[str] = None
    files: dict[str, bytes] = {}
    for key, p in params.items():
        kind = p.WhichOneof("parameter_choice")
        if key == "config":
            if kind != "string_param":
                raise _bad(f"invalid value type for load parameter '{key}', expected string_param.")
            config = p.string_param
        elif key.startswith(FILE_PREFIX):
            if kind != "bytes_param":
                raise _bad(f"invalid value type for load parameter '{key}', expected bytes_param.")
            files[key] = p.bytes_param
        else:
            raise _bad(f"unrecognized load parameter '{key}'.")
    return config, files


def unload_dependents(params) -> bool:
    """RepositoryModelUnload's `unload_dependents` (bool_param) parameter."""
    if "unload_dependents" not in params:
        return False
    p = params["unload_dependents"]
    if p.WhichOneof("parameter_choice") != "bool_param":
        raise _bad("invalid value type for 'unload_dependents' parameter, expected bool_param.")
    return p.bool_param


def _bad(message: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, message)
