"""HTTP routes of the model repository extension, over the core's model control.

    POST /v2/repository/index                       {"ready": bool}?
    POST /v2/repository/models/<model>/load         {"parameters": {"config": "<json>", "file:<path>": "<base64>"}}?
    POST /v2/repository/models/<model>/unload       {"parameters": {"unload_dependents": bool}}?

`/v2/repository/<repository>/...` names a repository, which (as in
tritonserver) is refused. The model name is taken from the raw path and
percent-decoded, so "a%2Fb" reaches the core as "a/b" and is refused there.
"""

from __future__ import annotations

import binascii
from typing import Optional
from urllib.parse import unquote

import msgspec

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.backend import FILE_PREFIX
from kernel.transports.asgi import send_error, send_json, send_status
from kernel.transports.http import json_errors

PREFIX = "/v2/repository"

_decode = msgspec.json.Decoder()


def is_repository_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def _route(raw_path: str) -> Optional[tuple[str, str, str]]:
    """(repository name or '', model name or '', action) or None when the path is not a route."""
    parts = raw_path[len(PREFIX):].split("/")
    # parts: ["", ("<repo>",)? "index"] or ["", ("<repo>",)? "models", "<model>", "load"|"unload"]
    if len(parts) < 2 or parts[0] != "":
        return None
    parts = parts[1:]
    repo = ""
    if parts[0] not in ("index", "models") or (parts[0] == "models" and len(parts) == 2):
        repo, parts = unquote(parts[0], errors="strict"), parts[1:]
    if parts == ["index"]:
        return repo, "", "index"
    if len(parts) == 3 and parts[0] == "models" and parts[1] and parts[2] in ("load", "unload"):
        return repo, unquote(parts[1], errors="strict"), parts[2]
    return None


async def handle(app, scope, method: str, receive, send) -> None:
    """Serve one repository request; KernelError propagates to the app's error mapping."""
    raw = scope.get("raw_path") or scope["path"].encode()
    try:
        route = _route(raw.split(b"?", 1)[0].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise KernelError(ErrorCode.INVALID_ARG, "the model name in the request path is not valid UTF-8") from None
    if route is None:
        await send_error(send, 404, "Not Found")
        return
    repo, name, action = route
    if method != "POST":
        await send_error(send, 405, "Method Not Allowed")
        return
    body = await app.read_control_body(receive)
    if body is None:
        return  # the client went away
    if repo:
        raise KernelError(ErrorCode.UNSUPPORTED, "'repository_name' specification is not supported")
    request = _parse_body(body)
    control = app.server.control
    if action == "index":
        await send_json(send, 200, await control.index(_ready_flag(request)))
    elif action == "load":
        config, files = _load_parameters(request)
        await control.load(name, config, files)
        await send_status(send, 200)
    else:
        await control.unload(name, _unload_dependents(request))
        await send_status(send, 200)


def _parse_body(body: bytes) -> dict:
    if not body.strip():
        return {}
    try:
        request = _decode.decode(body)
    except msgspec.DecodeError as exc:
        # tritonserver's words and offset (RapidJSON's) for a body that is not JSON; 400, not its 500
        where = json_errors.describe(body)
        if where is None:
            raise KernelError(ErrorCode.INVALID_ARG, f"failed to parse the request JSON buffer: {exc}") from None
        raise KernelError(ErrorCode.INVALID_ARG, f"failed to parse the request JSON buffer: {where}") from None
    if not isinstance(request, dict):
        raise KernelError(ErrorCode.INVALID_ARG, "the request body must be a JSON object")
    return request


def _ready_flag(request: dict) -> bool:
    ready = request.get("ready", False)
    if not isinstance(ready, bool):
        # tritonserver's words (its status is 500; a client's mistake is 400 here, issue 14)
        raise KernelError(ErrorCode.INVALID_ARG, "attempt to access JSON non-boolean as boolean")
    return ready


def _parameters(request: dict) -> dict:
    params = request.get("parameters", {})
    if not isinstance(params, dict):
        raise KernelError(ErrorCode.INVALID_ARG, "'parameters' must be a JSON object")
    return params


def _load_parameters(request: dict) -> tuple[Optional[str], dict[str, bytes]]:
    """The load request's `config` (JSON text) and `file:` parameters (base64-decoded)."""
    config: Optional[str] = None
    files: dict[str, bytes] = {}
    for key, value in _parameters(request).items():
        if key == "config":
            if not isinstance(value, str):
                # tritonserver's words (its status is 500; a client's mistake is 400 here, issue 14)
                raise KernelError(ErrorCode.INVALID_ARG, "attempt to access JSON non-string as string")
            config = value
        elif key.startswith(FILE_PREFIX):
            if not isinstance(value, str):
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"invalid value type for load parameter '{key}', expected a base64-encoded string",
                )
            try:
                files[key] = binascii.a2b_base64(value.encode("ascii"), strict_mode=True)
            except (binascii.Error, UnicodeEncodeError) as exc:
                raise KernelError(
                    ErrorCode.INVALID_ARG, f"failed to decode the base64 content of load parameter '{key}': {exc}"
                ) from None
        else:
            raise KernelError(ErrorCode.INVALID_ARG, f"unrecognized load parameter '{key}'.")
    return config, files


def _unload_dependents(request: dict) -> bool:
    value = _parameters(request).get("unload_dependents", False)
    if not isinstance(value, bool):
        raise KernelError(
            ErrorCode.INVALID_ARG, "Unable to parse 'unload_dependents': attempt to access JSON non-boolean as boolean"
        )
    return value
