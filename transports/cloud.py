"""Plumbing shared by the SageMaker and Vertex AI transports.

Both are small raw-ASGI apps in front of the KServe v2 HTTP app: they check
their own routes, then hand the request to an `HttpApp` with a rewritten
scope (path, method, headers). Each runs its own uvicorn server, on its own
port, in the front process's event loop (see HttpTransport).
"""

from __future__ import annotations

import re
from typing import Optional
from urllib.parse import quote

import msgspec

from kernel.core.errors import ErrorCode, KernelError
from kernel.transports.restrictions import Restrictions
from kernel.core.server import Server
from kernel.transports.http.app import DEFAULT_MAX_JSON_OUTPUT_SIZE, HttpApp
from kernel.transports.http.body import check_json_values, read_body
from kernel.transports.http.transport import HttpTransport

IHCL = b"inference-header-content-length"


class CloudHttpTransport(HttpTransport):
    """An HttpTransport whose ASGI app is a cloud front (`make_app(server, http_app)`)."""

    fast_path = False  # every request goes to the cloud app, KServe's infer route included
    # start() checks the endpoint's model (its default model must exist): after the models load.
    serves_while_loading = False

    def __init__(self, server: Server, address: str, port: int, max_input_size: int,
                 restricted: Optional[Restrictions] = None,
                 max_json_output_size: int = DEFAULT_MAX_JSON_OUTPUT_SIZE):
        # --http-restricted-api applies behind the cloud fronts too, as in tritonserver.
        super().__init__(server, address, port, max_input_size, "uvicorn", restricted=restricted,
                         max_json_output_size=max_json_output_size)
        self.http_app: HttpApp = self.app
        self.app = self.make_app(server, self.http_app)

    def make_app(self, server: Server, http_app: HttpApp):  # pragma: no cover - overridden
        raise NotImplementedError


# ---- responses -------------------------------------------------------------------


async def drain_body(receive) -> None:
    """Read and drop a request body we will not use (so the connection stays clean)."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


async def read_json_body(receive, limit: int, what: str) -> Optional[object]:
    """The request body parsed as JSON (None if the client went away); KernelError when invalid."""
    def refuse(size: int, limit: int) -> None:
        if size > limit:
            raise KernelError(ErrorCode.INVALID_ARG, f"{what} request body exceeds {limit} bytes")

    body = await read_body(receive, limit, refuse)
    if body is None:
        return None
    await check_json_values(body)
    try:
        return msgspec.json.decode(body) if body.strip() else {}
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise KernelError(ErrorCode.INVALID_ARG, f"failed to parse the {what} request JSON: {exc}") from None
    except RecursionError:
        raise KernelError(ErrorCode.INVALID_ARG, f"failed to parse the {what} request JSON: nested too deeply") from None


# ---- handing a request to the KServe v2 app ------------------------------------------


def header(scope, name: bytes) -> Optional[str]:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def binary_header_length(scope, mime_prefix: str) -> Optional[int]:
    """The JSON header size a `<mime_prefix><n>` Content-Type announces (binary tensor data), or None.

    The platforms carry the binary-data split in the Content-Type rather than
    in Inference-Header-Content-Length.
    """
    content_type = header(scope, b"content-type")
    if content_type is None:
        return None
    pos = content_type.find(mime_prefix)
    if pos < 0:
        return None
    if pos != 0:
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"expect MIME type for binary data starts with '{mime_prefix}', got: {content_type}",
        )
    text = content_type[len(mime_prefix):].strip()
    match = re.match(r"[+-]?\d+", text)
    if match is None:
        raise KernelError(ErrorCode.INVALID_ARG, f"Unable to parse inference header size, got: {text}")
    value = int(match.group(0))
    length = header(scope, b"content-length")
    limit = int(length) if length is not None and length.isdigit() else None
    if value < 0 or (limit is not None and value > limit):
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"inference header size should be in range (0, {limit if limit is not None else 'body size'}), "
            f"got: {text}",
        )
    return value


def with_header_length(scope, mime_prefix: str) -> list:
    """The request headers, with the platform's binary Content-Type turned into Inference-Header-Content-Length."""
    length = binary_header_length(scope, mime_prefix)
    if length is None:
        return scope["headers"]
    headers = [(k, v) for k, v in scope["headers"] if k != IHCL]
    headers.append((IHCL, str(length).encode()))
    return headers


def model_path(name: str, version: str = "", action: str = "") -> str:
    path = f"/v2/models/{name}"
    if version:
        path += f"/versions/{version}"
    if action:
        path += f"/{action}"
    return path


async def delegate(app: HttpApp, scope, receive, send, path: str, method: str, headers=None) -> None:
    """Run `app` as if the client had called `method path` on the KServe v2 HTTP endpoint."""
    inner = dict(scope)
    inner["path"] = path
    inner["raw_path"] = quote(path).encode()
    inner["method"] = method
    inner["query_string"] = b""
    if headers is not None:
        inner["headers"] = headers
    await app(inner, receive, send)


