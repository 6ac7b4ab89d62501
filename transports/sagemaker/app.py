"""The SageMaker hosting contract as a raw ASGI app, in front of the KServe v2 HTTP app.

    GET    /ping                          200 when serving (ping mode "ready": server and models
                                          ready; "live": process alive), 400 otherwise
    POST   /invocations                   the endpoint's model: KServe v2 infer (or generate /
                                          generate_stream, per SAGEMAKER_TRITON_INFERENCE_TYPE)
    POST   /invocations-response-stream   the same, answered as server-sent events, one per response
  multi-model endpoints (served whether or not SAGEMAKER_MULTI_MODEL=true, as tritonserver 2.51
  serves them; unknown names are a 404 with an empty body, as there):
    GET    /models                        {"models": [{"modelName", "modelUrl"}, ...]}; modelUrl is
                                          the url loaded, less SageMaker's '/model' (as tritonserver)
    POST   /models                        load {"model_name", "url"}: 200, 409 already loaded,
                                          400 bad request / cannot load, 507 out of resources
    GET    /models/<name>                 {"modelName", "modelUrl"} or 404
    DELETE /models/<name>                 unload: 200 or 404
    POST   /models/<name>/invoke          KServe v2 infer on that model (404 if not loaded)

Binary tensor data: the request's Content-Type
`application/vnd.sagemaker-triton.binary+json;json-header-size=<n>` gives the
JSON header size, and a binary response comes back with the same form.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kernel.core.errors import ErrorCode, KernelError
from kernel.transports.restrictions import Category
from kernel.core.server import Server
from kernel.transports.asgi import lifespan, send_error, send_json, send_status
from kernel.transports import cloud, listen
from kernel.transports.http import generate
from kernel.transports.asgi import status_for
from kernel.transports.http.app import HttpApp

log = logging.getLogger("kernel.sagemaker")

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
TARGET_MODEL_HEADER = b"x-amzn-sagemaker-target-model"
INFERENCE_TYPES = ("infer", "generate", "generate_stream")
PING_MODES = ("ready", "live")
# tritonserver's answer to /invocations when SAGEMAKER_TRITON_DEFAULT_MODEL_NAME names no model.
NO_DEFAULT_MODEL = "Request for unknown model: 'unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME' is not found"

_MODELS_ROUTE = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")
_ENSEMBLE = re.compile(r"platform\s*:\s*\"ensemble\"")
_FORBIDDEN_PREFIXES = ("/dev/", "/proc/", "/sys/")
# SageMaker's url for a model: /opt/ml/models/<hash>/model (maybe a subfolder after it). When that
# folder is the model itself (config.pbtxt inside), tritonserver registers the folder above
# (/opt/ml/models/<hash>) as the repository and reports that as the modelUrl (measured with 2.51;
# Triton's QA expects the url without '/model'). Any other url is the repository, as given.
_SAGEMAKER_MODEL_URL = re.compile(r"(.+)/model/?([0-9A-Za-z._]+)?")
# Substrings of the errors frameworks raise when memory runs out; a load or an
# inference failing with one of them is answered 507 (SageMaker then evicts models).
_OOM_MARKERS = (
    "out of memory", "cuda_out_of_memory", "memoryerror", "outofmemory", "failed to allocate memory",
    "dst tensor is not initialized", "src tensor is not initialized", "cnmem_status_out_of_memory",
    "cudnn_status_not_initialized", "cublas_status_alloc_failed", "cublas_status_not_initialized",
    "no space left on device",
)


def is_out_of_resources(message: str) -> bool:
    low = message.lower()
    return "OOM" in message or any(m in low for m in _OOM_MARKERS)


MODELS_ROUTES_NEED_ONE_FRONT = (
    "the multi-model endpoint routes (/models) need SAGEMAKER_MULTI_MODEL=true, which Kernel serves with one "
    "front process; this server runs several (--front-processes)")


@dataclass
class SageMakerSettings:
    """What tritonserver reads from the environment for its SageMaker endpoint."""

    default_model: Optional[str] = None  # SAGEMAKER_TRITON_DEFAULT_MODEL_NAME
    ping_mode: str = "ready"  # SAGEMAKER_TRITON_PING_MODE
    inference_type: str = "infer"  # SAGEMAKER_TRITON_INFERENCE_TYPE
    multi_model: bool = False  # SAGEMAKER_MULTI_MODEL=true

    @classmethod
    def from_env(cls, env=None) -> "SageMakerSettings":
        env = os.environ if env is None else env
        return cls(
            default_model=env.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME") or None,
            ping_mode=env.get("SAGEMAKER_TRITON_PING_MODE", "ready") or "ready",
            inference_type=env.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer") or "infer",
            multi_model=env.get("SAGEMAKER_MULTI_MODEL", "").strip().lower() == "true",
        )


@dataclass
class _Loaded:
    url: str  # the repository registered for it, as tritonserver reports it (see _registered_url)
    target: str  # the name the model is registered under
    dependencies: list[str] = field(default_factory=list)


def _category(path: str, method: str) -> Optional[Category]:
    """The restricted-API group of a SageMaker route, as tritonserver groups them."""
    if path.startswith("/invocations"):
        return Category.INFERENCE
    m = _MODELS_ROUTE.fullmatch(path)
    if m is None:
        return None
    return Category.INFERENCE if m.group(2) and method == "POST" else Category.MODEL_REPOSITORY


class SageMakerApp:
    def __init__(self, server: Server, http_app: HttpApp, settings: SageMakerSettings):
        self.server = server
        self.http_app = http_app
        self.settings = settings
        self.model_name: Optional[str] = settings.default_model
        self.models: dict[str, _Loaded] = {}  # multi-model endpoint: name (hash) -> where it came from
        self._busy: set[str] = set()  # names being loaded or unloaded
        # This process shares the port with other front processes (--front-processes): which models the
        # /models routes loaded, and under which names, would be known only to the front that loaded them,
        # so those routes are refused. SAGEMAKER_MULTI_MODEL=true runs one front process and serves them.
        self.models_refusal: Optional[str] = MODELS_ROUTES_NEED_ONE_FRONT if listen.shared_ports else None

    # ---- start-up ----------------------------------------------------------------

    def check(self) -> None:
        """Validate the settings against the loaded repository (raises ValueError with the reason)."""
        s = self.settings
        if s.inference_type not in INFERENCE_TYPES:
            raise ValueError(
                f"Invalid SAGEMAKER_TRITON_INFERENCE_TYPE '{s.inference_type}': must be one of "
                + ", ".join(INFERENCE_TYPES)
            )
        if s.ping_mode not in PING_MODES:
            raise ValueError(f"Invalid SAGEMAKER_TRITON_PING_MODE '{s.ping_mode}': must be 'ready' or 'live'")
        names = sorted(self.server.registry.entries)
        if self.model_name:
            if self.model_name not in names and not s.multi_model:
                raise ValueError(
                    f"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is '{self.model_name}' but the model repository has "
                    f"no such model (models: {', '.join(names) or 'none'})"
                )
        elif not s.multi_model:
            if len(names) == 1:
                self.model_name = names[0]
                log.warning(
                    "No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided; /invocations serves the only model, '%s'",
                    self.model_name,
                )
            else:
                log.warning(
                    "No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided and the repository has %d models; "
                    "/invocations will refuse requests until one is named",
                    len(names),
                )

    # ---- routing -------------------------------------------------------------------

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if self.http_app.restricted is not None and await self.http_app.refused(_category(path, method), scope, send):
            return
        try:
            if path == "/ping":
                await self._ping(method, send)
            elif path == "/invocations":
                await self._invocations(scope, receive, send, stream=False)
            elif path == "/invocations-response-stream":
                await self._invocations(scope, receive, send, stream=True)
            elif _MODELS_ROUTE.fullmatch(path):
                m = _MODELS_ROUTE.fullmatch(path)
                if self.models_refusal is not None:
                    await cloud.drain_body(receive)
                    await send_error(send, 400, self.models_refusal)
                    return
                await self._models(m.group(1) or "", bool(m.group(2)), method, scope, receive, send)
            else:
                await send_status(send, 400)  # tritonserver: 400, no body
        except KernelError as exc:
            await send_error(send, self._error_status(exc.message, status_for(exc)), exc.message)
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the endpoint down
            log.exception("unexpected error handling SageMaker %s %s", method, path)
            await send_error(send, 500, f"internal error: {type(exc).__name__}: {exc}")

    @staticmethod
    def _error_status(message: str, default: int) -> int:
        return 507 if is_out_of_resources(message) else default

    async def _ping(self, method: str, send) -> None:
        if method != "GET":
            await send_error(send, 405, "Method Not Allowed")
            return
        ok = self.server.live if self.settings.ping_mode == "live" else self.server.ready
        await send_status(send, 200 if ok else 400)

    async def _invocations(self, scope, receive, send, stream: bool) -> None:
        if scope["method"] != "POST":
            await send_error(send, 405, "Method Not Allowed")
            return
        name = self.model_name
        if not name:
            # tritonserver looks up a placeholder model name and answers in these words.
            await cloud.drain_body(receive)
            await send_error(send, 404, NO_DEFAULT_MODEL)
            return
        kind = self.settings.inference_type
        if kind == "infer" and not stream:
            await self._infer(name, scope, receive, send, multi_model=False)
        elif kind == "infer":
            header_length = cloud.binary_header_length(scope, BINARY_MIME)
            if header_length is None:
                length = cloud.header(scope, cloud.IHCL)
                header_length = int(length) if length is not None and length.isdigit() else None
            await generate.handle_infer_stream(self.http_app, name, "", header_length, receive, send,
                                               transport=scope.get("kernel.transport"))
        else:
            action = "generate_stream" if stream or kind == "generate_stream" else "generate"
            await cloud.delegate(self.http_app, scope, receive, send, cloud.model_path(name, "", action), "POST")

    async def _infer(self, name: str, scope, receive, send, multi_model: bool) -> None:
        headers = cloud.with_header_length(scope, BINARY_MIME)
        wrapped = _SageMakerResponse(send, multi_model)
        await cloud.delegate(self.http_app, scope, receive, wrapped, cloud.model_path(name, "", "infer"), "POST", headers)

    # ---- multi-model endpoints ---------------------------------------------------------

    async def _models(self, name: str, invoke: bool, method: str, scope, receive, send) -> None:
        if method == "GET" and not invoke:
            if name:
                loaded = self.models.get(name)
                if loaded is None:
                    await send_status(send, 404)
                else:
                    await send_json(send, 200, {"modelName": name, "modelUrl": loaded.url})
            else:
                listing = [
                    {"modelName": n, "modelUrl": m.url}
                    for n, m in sorted(self.models.items())
                    if await self.server.model_ready(m.target)
                ]
                await send_json(send, 200, {"models": listing})
        elif method == "POST" and invoke:
            loaded = self.models.get(name)
            if loaded is None:
                await cloud.drain_body(receive)
                await send_status(send, 404)
                return
            log.info("Invoking SageMaker TargetModel: %s", cloud.header(scope, TARGET_MODEL_HEADER) or name)
            await self._infer(loaded.target, scope, receive, send, multi_model=True)
        elif method == "POST":
            await self._load(scope, receive, send)
        elif method == "DELETE":
            await self._unload(name, scope, send)
        else:
            await send_error(send, 405 if method in ("PUT", "PATCH") else 400, f"{method} is not supported on {scope['path']}")

    async def _load(self, scope, receive, send) -> None:
        doc = await cloud.read_json_body(receive, self.http_app.max_input_size, "load model")
        if doc is None:
            return
        if not isinstance(doc, dict):
            raise KernelError(ErrorCode.INVALID_ARG, "load model request must be a JSON object")
        name = doc.get("model_name")
        url = doc.get("url")
        if not isinstance(name, str) or not name:
            raise KernelError(ErrorCode.INVALID_ARG, "load model request needs a 'model_name' string")
        if not isinstance(url, str) or not url:
            raise KernelError(ErrorCode.INVALID_ARG, "load model request needs a 'url' string (the model's local path)")
        target = cloud.header(scope, TARGET_MODEL_HEADER) or name
        # Both become model names (the target is what the model is registered under): the same
        # rules as model control's, so neither can hold a path ('a/b', '../../x') or shell characters.
        self.server.control.validate_name(name)
        self.server.control.validate_name(target)
        log.info("Loading SageMaker TargetModel: %s", target)
        abspath = os.path.abspath(os.path.normpath(url))
        if any((abspath + "/").startswith(p) for p in _FORBIDDEN_PREFIXES):
            raise KernelError(ErrorCode.INVALID_ARG, f"Invalid url '{url}': it cannot start with /dev/, /proc/ or /sys/")
        registered = await asyncio.to_thread(_registered_url, url, Path(abspath))
        if any(m.url == registered for m in self.models.values()):  # tritonserver's words: it registers the url
            await send_error(send, 409, f"model repository '{registered}' has already been registered")
            return
        if name in self.models or name in self._busy or target in self._busy:
            await send_error(send, 409, f"model '{name}' is already loaded")
            return
        self._busy.update((name, target))
        try:
            try:
                main_dir, dependencies = await asyncio.to_thread(_resolve_model_dirs, Path(abspath), url)
            except OSError as exc:
                raise KernelError(ErrorCode.INVALID_ARG, f"failed to load model from url '{url}': {exc}") from None
            loaded_deps: list[str] = []
            try:
                for dep in dependencies:
                    await self.server.control.load_from_path(dep.name, dep)
                    loaded_deps.append(dep.name)
                await self.server.control.load_from_path(target, main_dir)
            except KernelError:
                for dep_name in loaded_deps:
                    await self._quiet_unload(dep_name)
                raise
        except KernelError as exc:
            if exc.code is ErrorCode.ALREADY_EXISTS:
                await send_error(send, 409, exc.message)
            else:
                await send_error(send, self._error_status(exc.message, 400), exc.message)
            return
        finally:
            self._busy.difference_update((name, target))
        self.models[name] = _Loaded(registered, target, loaded_deps)
        await send_status(send, 200)

    async def _unload(self, name: str, scope, send) -> None:
        loaded = self.models.get(name)
        if loaded is None or name in self._busy:
            await send_status(send, 404)
            return
        log.info("Unloading SageMaker TargetModel: %s", cloud.header(scope, TARGET_MODEL_HEADER) or loaded.target)
        self._busy.add(name)
        try:
            await self.server.control.unload_from_path(loaded.target)
            for dep in loaded.dependencies:
                await self._quiet_unload(dep)
        except KernelError as exc:
            await send_error(send, 400, exc.message)
            return
        finally:
            self._busy.discard(name)
            self.models.pop(name, None)
        await send_status(send, 200)

    async def _quiet_unload(self, name: str) -> None:
        try:
            await self.server.control.unload_from_path(name)
        except KernelError as exc:
            log.warning("unloading '%s' failed: %s", name, exc.message)


def _registered_url(url: str, path: Path) -> str:
    """The repository tritonserver registers for a load's url: the folder above SageMaker's
    <parent>/model when that names the model itself, else the url as given."""
    match = _SAGEMAKER_MODEL_URL.fullmatch(url)
    if match is not None and (path / "config.pbtxt").is_file():
        return match.group(1)
    return url


def _resolve_model_dirs(path: Path, url: str) -> tuple[Path, list[Path]]:
    """The model folder a load request's url names, and the models it depends on.

    `url` is either a model folder (config.pbtxt or version folders inside) or
    a repository holding one model folder - or several, one of them an
    ensemble, which is then the model and the others its steps.
    """
    if not path.is_dir():
        raise KernelError(ErrorCode.INVALID_ARG, f"failed to register '{url}', repository not found")
    if _is_model_dir(path):
        return path, []
    subdirs = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    candidates = [p for p in subdirs if _is_model_dir(p)]
    if not candidates:
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"failed to load model from url '{url}': it is neither a model directory nor a repository with one",
        )
    if len(candidates) == 1:
        return candidates[0], []
    ensembles = [p for p in candidates if _is_ensemble(p)]
    if len(ensembles) != 1:
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"failed to load model from url '{url}': found {len(candidates)} model directories "
            f"({', '.join(p.name for p in candidates)}) and {len(ensembles)} ensembles; expected one model, "
            "or one ensemble and its steps",
        )
    main = ensembles[0]
    return main, [p for p in candidates if p != main]


def _is_model_dir(path: Path) -> bool:
    if (path / "config.pbtxt").is_file():
        return True
    return any(p.is_dir() and p.name.isdigit() for p in path.iterdir())


def _is_ensemble(path: Path) -> bool:
    try:
        return bool(_ENSEMBLE.search((path / "config.pbtxt").read_text(errors="replace")))
    except OSError:
        return False


class _SageMakerResponse:
    """Rewrites the KServe v2 app's answer into SageMaker's form.

    Binary responses announce their JSON size in the Content-Type instead of
    Inference-Header-Content-Length; errors that mean "out of memory" become
    507; on multi-model invoke every other error is a 400, as SageMaker expects.
    """

    def __init__(self, send, multi_model: bool):
        self._send = send
        self._multi_model = multi_model
        self._held: Optional[dict] = None
        self._body: list[bytes] = []

    async def __call__(self, message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            headers = message.get("headers", [])
            length = next((v for k, v in headers if k == cloud.IHCL), None)
            if length is not None:
                headers = [(k, v) for k, v in headers if k not in (cloud.IHCL, b"content-type")]
                headers.append((b"content-type", BINARY_MIME.encode() + length))
                message = dict(message, headers=headers)
            if message["status"] >= 400:
                self._held = message
                return
            await self._send(message)
            return
        if kind == "http.response.body" and self._held is not None:
            self._body.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = b"".join(self._body)
            status = self._held["status"]
            text = body.decode("utf-8", "replace")
            if is_out_of_resources(text):
                status = 507
            elif self._multi_model:
                status = 400
            held, self._held = self._held, None
            await self._send(dict(held, status=status))
            await self._send({"type": "http.response.body", "body": body})
            return
        await self._send(message)
