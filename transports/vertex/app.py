"""The Vertex AI custom-container contract as a raw ASGI app, in front of the KServe v2 HTTP app.

    GET  $AIP_HEALTH_ROUTE    200 when the server is ready, 400 otherwise
    POST $AIP_PREDICT_ROUTE   KServe v2 infer on the default model; with the header
                              `X-Vertex-Ai-Triton-Redirect: v2/...` the request goes to that
                              KServe v2 endpoint instead (metadata, config, ready, health, infer
                              on any model, statistics, repository index, shared-memory status);
                              the value `metrics` answers with the Prometheus metrics page

Vertex AI only sends POST to the predict route, so a redirect to a read-only
endpoint is served as the GET that endpoint expects. Redirects that would
change server state (model load/unload, shared-memory register/unregister) are
refused with 403; a value that is not a plain relative `v2/...` path (`..`,
percent-encoding, absolute paths or URLs, query strings) is refused with 400.

Binary tensor data: `application/vnd.vertex-ai-triton.binary+json;json-header-size=<n>`
in the request's Content-Type gives the JSON header size.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

from kernel.core.errors import KernelError
from kernel.core.server import Server
from kernel.observe.metrics import MetricsService
from kernel.transports.asgi import lifespan, send_error, send_response, send_status
from kernel.transports import cloud
from kernel.transports.asgi import status_for
from kernel.transports.http.app import HttpApp

log = logging.getLogger("kernel.vertex")

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT_HEADER = b"x-vertex-ai-triton-redirect"
# tritonserver answers this redirect value with the metrics endpoint's Prometheus text (a
# read-only page, so monitoring through the predict route works as it does there).
METRICS_REDIRECT = "metrics"

_MODEL_READS = ("", "ready", "config", "stats")
_SHM_ACTIONS = ("status", "register", "unregister")
_UNSAFE_CHARS = set("%\\?#;:@ \t\r\n\x00")


@dataclass
class VertexSettings:
    predict_route: str = ""  # AIP_PREDICT_ROUTE
    health_route: str = ""  # AIP_HEALTH_ROUTE
    default_model: str = ""  # --vertex-ai-default-model

    @classmethod
    def from_env(cls, default_model: str = "", env=None) -> "VertexSettings":
        env = os.environ if env is None else env
        return cls(env.get("AIP_PREDICT_ROUTE", ""), env.get("AIP_HEALTH_ROUTE", ""), default_model or "")


class RedirectRefused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def resolve_redirect(value: str) -> tuple[str, str]:
    """(path, method) on the KServe v2 app for an X-Vertex-Ai-Triton-Redirect value; RedirectRefused if not allowed."""
    if not value or value.startswith("/") or "//" in value or any(c in _UNSAFE_CHARS for c in value):
        raise RedirectRefused(
            400,
            f"invalid {REDIRECT_HEADER.decode()} value '{value}': expected a relative KServe v2 path such as "
            "'v2/models/<model>/infer'",
        )
    parts = value.split("/")
    if any(p in ("", ".", "..") for p in parts) or not value.isascii() or not value.isprintable():
        raise RedirectRefused(400, f"invalid {REDIRECT_HEADER.decode()} value '{value}': path segments must be names")
    if parts[0] != "v2":
        raise RedirectRefused(400, f"redirect to '{value}' is not allowed: only KServe v2 endpoints (v2/...) can be reached")
    path = "/" + value
    rest = parts[1:]
    if not rest:
        return path, "GET"
    if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
        return path, "GET"
    if rest[0] == "models":
        if rest[1:] == ["stats"]:
            return path, "GET"
        tail = rest[2:]
        if len(rest) >= 2:
            if len(tail) >= 2 and tail[0] == "versions":
                if not tail[1].isdigit():
                    raise RedirectRefused(400, f"redirect to '{value}': model version must be a number")
                tail = tail[2:]
            if len(tail) <= 1:
                kind = tail[0] if tail else ""
                if kind == "infer":
                    return path, "POST"
                if kind in _MODEL_READS:
                    return path, "GET"
    if rest[0] in ("systemsharedmemory", "cudasharedmemory"):
        tail = rest[1:]
        if len(tail) == 3 and tail[0] == "region":
            tail = tail[2:]
        if len(tail) == 1 and tail[0] in _SHM_ACTIONS:
            if tail[0] == "status":
                return path, "GET"
            raise RedirectRefused(403, f"redirect to '{value}' is forbidden: only status queries are allowed")
    if rest[0] == "repository":
        tail = rest[1:]
        if tail == ["index"] or (len(tail) == 2 and tail[1] == "index"):
            return path, "POST"
        if len(tail) >= 3 and tail[-3] == "models" and tail[-1] in ("load", "unload") and len(tail) <= 4:
            raise RedirectRefused(403, f"redirect to '{value}' is forbidden: models cannot be loaded or unloaded here")
    raise RedirectRefused(400, f"redirect to '{value}' names no KServe v2 endpoint the Vertex AI route can reach")


class VertexApp:
    def __init__(self, server: Server, http_app: HttpApp, settings: VertexSettings):
        self.server = server
        self.http_app = http_app
        self.settings = settings
        self.model_name = settings.default_model
        self._metrics: Optional[MetricsService] = None  # made on the first metrics redirect

    def check(self) -> None:
        """Validate the environment and pick the default model (raises ValueError with the reason)."""
        s = self.settings
        if not s.predict_route:
            raise ValueError("API_PREDICT_ROUTE is not defined for Vertex AI endpoint")  # sic: tritonserver's wording
        if not s.health_route:
            raise ValueError("AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint")
        ready = sorted(n for n, e in self.server.registry.entries.items() if e.latest_ready() is not None)
        if not self.model_name:
            if len(ready) != 1:
                raise ValueError(
                    "Expect the model repository contains only a single model if default model is not specified "
                    f"(found {len(ready)}: {', '.join(ready) or 'none'}); use --vertex-ai-default-model"
                )
            self.model_name = ready[0]
        elif self.model_name not in ready:
            raise ValueError(f"Expect the default model '{self.model_name}' is loaded")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            if path == self.settings.health_route:
                if method != "GET":
                    await send_error(send, 405, "Method Not Allowed")
                else:
                    await send_status(send, 200 if self.server.ready else 400)
            elif path == self.settings.predict_route:
                await self._predict(scope, receive, send)
            else:
                await send_status(send, 400)  # tritonserver: 400, no body
        except KernelError as exc:
            await send_error(send, status_for(exc), exc.message)
        except Exception as exc:  # noqa: BLE001
            log.exception("unexpected error handling Vertex AI %s %s", method, path)
            await send_error(send, 500, f"internal error: {type(exc).__name__}: {exc}")

    async def _predict(self, scope, receive, send) -> None:
        if scope["method"] != "POST":
            await send_error(send, 405, "Method Not Allowed")
            return
        redirect: Optional[str] = cloud.header(scope, REDIRECT_HEADER)
        if redirect == METRICS_REDIRECT:
            await cloud.drain_body(receive)
            await self._send_metrics(send)
            return
        if redirect is None:
            path, method = cloud.model_path(self.model_name, "", "infer"), "POST"
        else:
            try:
                path, method = resolve_redirect(redirect)
            except RedirectRefused as exc:
                log.info("Vertex AI redirect refused: %s", exc.message)
                await cloud.drain_body(receive)
                if exc.status == 400:  # tritonserver: 400, no body, for a redirect it cannot serve
                    await send_status(send, 400)
                else:  # 403: Kernel's own refusal (state-changing redirects), said in words
                    await send_error(send, exc.status, exc.message)
                return
        headers = cloud.with_header_length(scope, BINARY_MIME)
        await cloud.delegate(self.http_app, scope, receive, send, path, method, headers)

    async def _send_metrics(self, send) -> None:
        """The metrics page, rendered here: the metrics port may be off or elsewhere (as in Triton)."""
        if self._metrics is None:
            self._metrics = MetricsService(self.server, self.server.metrics_config, cpu_metrics=False)
        await send_response(send, 200, [(b"content-type", b"text/plain; charset=utf-8")], (await self._metrics.total_text()).encode())
