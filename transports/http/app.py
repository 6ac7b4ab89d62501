"""The KServe v2 HTTP API as a raw ASGI application.

Raw ASGI rather than a framework router: on this path every microsecond is
per request (see benchmarks/results/http_servers.md), and the route table is
small enough to read at a glance below.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

import numpy as np

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import collect_single_response
from kernel.transports.restrictions import Category, Restrictions, http_message
from kernel.core.server import Server
from kernel.transports.asgi import lifespan, send_error, send_json, send_response, status_for
from kernel.transports.http.body import check_json_values, check_size, read_body
from kernel.transports import inflate
from kernel.transports.http import codec, generate, large_json, shared_memory
from kernel.transports.http import log_trace as settings
from kernel.transports.http import repository_api as repository
from kernel.transports.http.disconnect import DisconnectWatch
from kernel.transports.restrictions import http_category

log = logging.getLogger("kernel.http")

# Triton's mapping from error category to HTTP status.
_JSON = [(b"content-type", b"application/json")]
# Infer requests answered sooner never start a disconnect-watching task (transports/http/disconnect.py).
_WATCH_AFTER_S = 0.02
# Binary answers up to this size are joined on the loop (a copy well under a millisecond);
# larger ones beside it.
_JOIN_ANSWER_BYTES = 1 << 20
_EMPTY_OK = {"type": "http.response.body", "body": b""}
# Health answers carry the KServe v2 (Open Inference Protocol) bodies, {"live": bool} / {"ready": bool},
# which KServe's own clients decode; tritonserver 2.51 sends none (same status codes; a deliberate
# difference, peer_checks/differences.py). Model ready: {"name": m, "ready": true}, or Triton's error.
_LIVE = {True: b'{"live":true}', False: b'{"live":false}'}
_READY = {True: b'{"ready":true}', False: b'{"ready":false}'}


# --http-max-json-output-size: as much JSON text as the largest JSON body a client may send.
DEFAULT_MAX_JSON_OUTPUT_SIZE = 64 * 1024 * 1024


class HttpApp:
    def __init__(self, server: Server, max_input_size: int = 64 * 1024 * 1024,
                 restricted: Optional[Restrictions] = None,
                 max_json_output_size: int = DEFAULT_MAX_JSON_OUTPUT_SIZE):
        self.server = server
        self.max_input_size = max_input_size
        # The most bytes an answer's JSON may take (--http-max-json-output-size, codec.json_too_large).
        self.max_json_output_size = max_json_output_size
        # --http-restricted-api; None (not an empty set) when nothing is restricted: one check per request.
        self.restricted = restricted or None
        self.tracer = server.tracer
        # --http-header-forward-pattern (kernel.transports.header_forward.HeaderForwarder); None when unset.
        self.header_forward = None

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await lifespan(receive, send)

    async def _http(self, scope, receive, send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if self.restricted is not None and await self.refused(http_category(path), scope, send):
            return
        try:
            if path == "/v2/models/stats":  # statistics extension, every model
                self._require(method, "GET")
                await send_json(send, 200, await self.server.total_statistics())
            elif path.startswith("/v2/models/"):
                await self._model_route(path[11:], method, scope, receive, send)
            elif path == "/v2/health/live":
                self._require(method, "GET")  # tritonserver: 405 for any other method
                live = self.server.live
                await send_response(send, 200 if live else 400, _JSON, _LIVE[live])
            elif path == "/v2/health/ready":
                self._require(method, "GET")
                ready = self.server.ready
                await send_response(send, 200 if ready else 400, _JSON, _READY[ready])
            elif path in ("/v2", "/v2/"):
                self._require(method, "GET")
                await send_json(send, 200, self.server.metadata())
            elif repository.is_repository_path(path):  # model repository extension
                await repository.handle(self, scope, method, receive, send)
            elif shared_memory.is_shared_memory_path(path):  # shared-memory extensions
                await shared_memory.handle(self, path, method, receive, send)
            elif path == settings.LOGGING_PATH:  # logging extension
                await settings.handle_logging(self, method, receive, send)
            elif path == settings.TRACE_PATH:  # trace extension, global setting
                await settings.handle_trace(self, "", method, receive, send)
            else:
                await send_error(send, 404, "Not Found")
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the connection down
            await send_error(send, *error_for(exc, method, path))

    async def refused(self, category: Optional[Category], scope, send) -> bool:
        """Answer 403 when the API group is restricted and the request lacks the header.

        Only called when `restricted` is set (also by the SageMaker and Vertex AI fronts).
        """
        rule = self.restricted.get(category)
        if rule is None:
            return False
        wanted = rule.header.encode("latin-1")
        for key, value in scope["headers"]:
            if key.lower() == wanted and value.decode("latin-1") == rule.value:
                return False
        await send_error(send, 403, http_message(rule.header))
        return True

    @staticmethod
    def _require(method: str, expected: str) -> None:
        if method != expected:
            raise _MethodNotAllowed()

    async def _model_route(self, rest: str, method: str, scope, receive, send) -> None:
        # rest: "<model>[/versions/<v>][/<action>]"
        parts = rest.split("/")
        name = parts[0]
        version = ""
        tail = parts[1:]
        if len(tail) >= 2 and tail[0] == "versions":
            version = tail[1]
            tail = tail[2:]
            if not (version.isascii() and version.isdigit()):  # tritonserver's route wants [0-9]+: no match
                await send_error(send, 404, "Not Found")
                return
        action = tail[0] if tail else ""
        if tail == ["trace", "setting"] and name:  # trace extension, one model's setting
            await settings.handle_trace(self, name, method, receive, send)
            return
        if len(tail) > 1 or not name:
            await send_error(send, 404, "Not Found")
            return
        if action == "infer":
            self._require(method, "POST")
            if self.tracer.active:  # all that tracing costs while it is off (kernel/observe/trace.py)
                await self._traced_infer(name, version, scope, receive, send)
            else:
                await self._infer(name, version, scope, receive, send)
        elif action == "":
            self._require(method, "GET")
            await send_json(send, 200, self.server.model_metadata(name, version))
        elif action == "ready":
            self._require(method, "GET")
            if await self.server.model_ready(name, version):
                await send_json(send, 200, {"name": name, "ready": True})
            else:  # tritonserver's words, for an unknown model too
                await send_error(send, 400, "Model version not ready")
        elif action == "config":
            self._require(method, "GET")
            await send_json(send, 200, self.server.model_config(name, version))
        elif action == "stats":
            self._require(method, "GET")
            await send_json(send, 200, await self.server.total_statistics(name, version))
        elif action in ("generate", "generate_stream"):  # generate extension (transports/http/generate.py)
            self._require(method, "POST")
            await generate.handle_generate(self, name, version, action == "generate_stream", scope, receive, send)
        else:
            await send_error(send, 404, "Not Found")

    async def _traced_infer(self, name: str, version: str, scope, receive, send) -> None:
        """_infer while tracing is on: sample the request, and hand its trace over when done."""
        trace = self.tracer.sample(name, self.tracer.context(scope["headers"]))
        if trace is None:
            await self._infer(name, version, scope, receive, send, None)
            return
        trace.stamp("HTTP_RECV_START")
        try:
            await self._infer(name, version, scope, receive, send, trace)
        finally:
            trace.stamp("HTTP_SEND_END")
            trace.release()

    async def _infer(self, name: str, version: str, scope, receive, send, trace=None) -> None:
        header_length: Optional[int] = None
        encoding = None
        for key, value in scope["headers"]:
            if key == b"inference-header-content-length":
                header_length = codec.header_length(value)
            elif key == b"content-encoding":
                encoding = value.decode("latin-1").lower()
        body = await self.read_body(receive)
        if body is None:
            return  # client went away
        if trace is not None:
            trace.stamp("HTTP_RECV_END")
        held = self.server.held_output
        if held.over_limit:  # answers wait for slow readers past --max-held-output-bytes: hold no more
            raise KernelError(ErrorCode.UNAVAILABLE, held.refusal())
        if encoding and encoding != "identity":
            body = await self._decompress(body, encoding)
        decoded = None
        if len(body) > large_json.INLINE_REQUEST_BYTES and large_json.too_large_for_loop(body, header_length):
            decoded = await large_json.run(large_json.decode_request, body, header_length)
        request, binary_default, binary_choice = self.infer_request(name, version, body, header_length,
                                                                    scope["headers"], decoded)
        request.trace = trace
        future = collect_single_response(request)
        self.server.submit(request)
        watch = DisconnectWatch(receive, request, lambda: future.done() or future.set_result(None),
                                start_after=_WATCH_AFTER_S)
        try:
            response = await future
        finally:
            watch.close()
        if response is None:
            return  # the client disconnected; the request was cancelled
        if trace is not None:
            trace.on_response(response)
            trace.stamp("HTTP_SEND_START")
        if response.error is not None:
            await send_error(send, status_for(response.error), response.error.message)
            return
        limit = self.max_json_output_size
        try:
            body_out, json_length = codec.encode_infer_response(response, binary_default, binary_choice, limit)
        except codec.LargeJson:  # encoded in pieces beside the loop (large_json)
            body_out, json_length = await large_json.run(large_json.encode_answer, response, binary_default,
                                                         binary_choice, limit)
        if json_length is None:
            await send_response(send, 200, _JSON, body_out)
            return
        size = sum(len(part) for part in body_out)
        if size <= _JOIN_ANSWER_BYTES:
            # One body message: each ASGI body message is a write (a syscall) of its own.
            body = b"".join(body_out)
        else:
            # Joined on a thread: on the loop the copy (and its page faults) took ~20 ms for 32 MiB.
            # Still one message, so the whole answer is in the transport's buffer and in the
            # held-output account at once (parts sent one by one would wait in this task, uncounted,
            # behind a client that does not read).
            body = await asyncio.to_thread(_joined, body_out, size)
        await send({"type": "http.response.start", "status": 200, "headers": binary_headers(json_length, size)})
        await send({"type": "http.response.body", "body": body})

    def infer_request(self, name: str, version: str, body, header_length: Optional[int], headers, decoded=None):
        """(request, binary outputs by default, per-output choice) for an infer body; both the ASGI
        route and the fast path (transports/http/fast.py) build requests here, so they agree.
        decoded: the body's JSON decoded beside the loop already (large_json.decode_request)."""
        model = self.server.registry.get(name, version)
        if model.decoupled:  # tritonserver: 501, before the body is parsed
            raise KernelError(ErrorCode.UNSUPPORTED,
                              "HTTP end point doesn't support models with decoupled transaction policy")
        if header_length == 0:  # no JSON at all: the body is the one input's data (tritonserver's raw request)
            request, binary_default, binary_choice = codec.raw_infer_request(body, model, name, version), False, {}
        else:
            request, binary_default, binary_choice = codec.parse_infer_request(
                body, header_length, name, version, self.server.shared_memory, decoded
            )
        if self.header_forward is not None:
            self.header_forward.apply(request, headers)
        return request, binary_default, binary_choice

    async def read_body(self, receive) -> Optional[bytes]:
        """The whole request body, never past --http-max-input-size; None if the client went away."""
        return await read_body(receive, self.max_input_size)

    async def read_control_body(self, receive) -> Optional[bytes]:
        """read_body for a control route's JSON, refused if it holds too many values to decode (body.py)."""
        body = await read_body(receive, self.max_input_size)
        if body is not None:
            await check_json_values(body)
        return body

    async def _decompress(self, body: bytes, encoding: str) -> bytes:
        """The body inflated (kernel.transports.inflate: linear, off the loop once large), never
        past --http-max-input-size nor past its member limit. A gzip body may hold several
        members (RFC 1952: they concatenate); anything after the last complete stream, or a
        stream cut short, is refused rather than ignored."""
        if encoding not in inflate.ENCODINGS:
            raise KernelError(ErrorCode.UNSUPPORTED, f"unsupported Content-Encoding '{encoding}'")
        try:
            return await inflate.inflate(body, encoding, self.max_input_size)
        except inflate.InflateError as exc:
            if exc.bound == "size":
                check_size(exc.size, self.max_input_size)
            raise KernelError(ErrorCode.INVALID_ARG, f"failed to decompress the request body: {exc}") from None


def _joined(parts, size: int) -> memoryview:
    """`parts` (bytes-like) copied into one new buffer. numpy copies with the GIL released, and its
    buffer is not zero-filled first (bytearray's would be, holding the GIL); bytes.join keeps the
    GIL when a part is not bytes."""
    out = np.empty(size, np.uint8)
    pos = 0
    for part in parts:
        n = len(part)
        out[pos : pos + n] = np.frombuffer(part, np.uint8)
        pos += n
    return memoryview(out)


class _MethodNotAllowed(Exception):
    pass


def error_for(exc: Exception, method: str, path: str) -> tuple[int, str]:
    """The status and message an exception from a route is answered with (ASGI and fast path alike)."""
    if isinstance(exc, KernelError):
        return status_for(exc), exc.message
    if isinstance(exc, _MethodNotAllowed):
        return 405, "Method Not Allowed"
    if isinstance(exc, RecursionError):  # JSON nested deeper than any decoder here will follow: the client's doing
        return 400, "failed to parse the request JSON buffer: the JSON is nested too deeply"
    log.exception("unexpected error handling %s %s", method, path, exc_info=exc)
    return 500, f"internal error: {type(exc).__name__}: {exc}"


def binary_headers(json_length: int, body_length: int) -> list:
    """The headers of an infer response with binary outputs (binary tensor data extension)."""
    return [
        (b"content-type", b"application/octet-stream"),
        (b"inference-header-content-length", b"%d" % json_length),
        (b"content-length", b"%d" % body_length),
    ]


