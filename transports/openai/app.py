"""The OpenAI-compatible API as a raw ASGI application (no framework: the route table is below).

    GET  /v1/models                  the ready models it can serve (restricted API group: model-repository)
    GET  /v1/models/{model}          one of them               (model-repository)
    POST /v1/chat/completions        chat, streamed or not     (inference)
    POST /v1/completions             text completion           (inference)
    POST /v1/responses               the Responses API         (inference; responses.py)
    POST /v1/embeddings              text to vectors           (inference)
    POST /tokenize, /detokenize      a model's tokenizer       (inference; tokenizer.py)
    GET  /health, /ping, /health/ready   200 when the server is ready, else 503 (health)

The API groups are those of Triton's OpenAI frontend; `--http-restricted-api` restricts them here
as on the KServe port, and a request without the header gets 401 in OpenAI's error shape. With
--openai-api-key every route but the health ones also needs `Authorization: Bearer KEY` (401
`invalid_api_key` otherwise, as OpenAI answers), compared in constant time.

Admission, before anything is submitted: a server that holds more answer bytes for slow clients
than --max-held-output-bytes answers 503; a model whose config sets the parameter
`max_inflight_requests` answers 429 with Retry-After while it has that many requests in flight
(from any route: the nv_inference_inflight_request_count gauge); a model whose queue is full
(`max_queue_size`) answers 429 with Retry-After here, where the KServe routes keep Triton's 503.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import weakref
from typing import Optional

import msgspec

from kernel.core.errors import KernelError
from kernel.core.scheduling import in_flight_everywhere
from kernel.observe.openai_metrics import OpenAIMetrics
from kernel.transports.asgi import lifespan
from kernel.transports.http.body import read_body
from kernel.transports.openai import chat_template, embeddings, features, responses, schema, tokenizer, tracing
from kernel.transports.openai.forms import ChatForm, CompletionForm
from kernel.transports.openai.convention import serves_openai, text_model
from kernel.transports.openai.errors import (
    INVALID_REQUEST, SERVER_ERROR, ApiError, bad_request, error_body, from_kernel, model_not_found, send_error, too_many_requests,
)
from kernel.transports.openai.generation import Generation
from kernel.transports.openai.template_pool import TemplatePool
from kernel.transports.reset import reset
from kernel.transports.restrictions import Category, Restrictions

log = logging.getLogger("kernel.openai")

_JSON = [(b"content-type", b"application/json")]
# Bodies larger than this are decoded and turned into prompts off the event loop.
OFFLOAD_BYTES = 256 * 1024
_ROUTES = {
    "/v1/chat/completions": ("POST", Category.INFERENCE),
    "/v1/completions": ("POST", Category.INFERENCE),
    "/v1/responses": ("POST", Category.INFERENCE),
    "/v1/embeddings": ("POST", Category.INFERENCE),
    "/tokenize": ("POST", Category.INFERENCE),
    "/detokenize": ("POST", Category.INFERENCE),
    "/v1/models": ("GET", Category.MODEL_REPOSITORY),
    "/health/ready": ("GET", Category.HEALTH),
    "/health": ("GET", Category.HEALTH),
    "/ping": ("GET", Category.HEALTH),
}
_json = msgspec.json.Encoder()


def route_of(path: str) -> Optional[tuple[str, Category]]:
    """(method, API group) of a path, or None for paths this API does not have."""
    found = _ROUTES.get(path)
    if found is None and path.startswith("/v1/models/") and len(path) > 11:
        found = ("GET", Category.MODEL_REPOSITORY)
    return found


class OpenAIApp:
    def __init__(self, server, max_input_size: int = 64 * 1024 * 1024, restricted: Optional[Restrictions] = None,
                 max_json_output_size: int = 64 * 1024 * 1024, api_key: Optional[str] = None):
        self.server = server
        self.api_key = b"Bearer " + api_key.encode("utf-8") if api_key else None
        self.max_input_size = max_input_size
        self.max_json_output_size = max_json_output_size  # the most bytes a non-streamed answer may take
        self.restricted = restricted or None
        self.created = int(time.time())
        # Calls between their first byte and their last (Transport.transfers), and the streams among them.
        self.active = 0
        self.streams: set[Generation] = set()
        self._limits: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        # Chat templates render in processes of their own, started on the first template (template_pool.py).
        self.templates = TemplatePool(max_input_size)
        # Token counts and latencies on the metrics port (kernel.observe.openai_metrics).
        self.metrics = OpenAIMetrics.of(server)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        self.active += 1
        try:
            await self._http(scope, receive, send)
        finally:
            self.active -= 1

    async def _http(self, scope, receive, send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        route = route_of(path)
        try:
            if route is None:
                raise ApiError(404, f"Unknown request URL: {method} {path}", code="unknown_url")
            if method != route[0]:
                raise ApiError(405, f"Method {method} is not allowed for {path}; use {route[0]}",
                               code="method_not_allowed")
            if self.restricted is not None:
                self._check_restriction(route[1], scope)
            if self.api_key is not None and route[1] is not Category.HEALTH:
                self._check_key(scope)
            if path == "/v1/chat/completions":
                await self._completion(True, scope, receive, send)
            elif path == "/v1/completions":
                await self._completion(False, scope, receive, send)
            elif path == "/v1/responses":
                await self._completion(None, scope, receive, send)
            elif path in ("/tokenize", "/detokenize"):
                body = await self._body(scope, receive)
                if body is not None:
                    await _send_json(send, 200, await tokenizer.handle(self, path == "/tokenize", body))
            elif path == "/v1/embeddings":
                started = tracing.start_ns(self.server)
                body = await self._body(scope, receive)
                if body is not None:
                    await embeddings.handle(self, body, scope, receive, send, started)
            elif path == "/v1/models":
                await _send_json(send, 200, {"object": "list", "data": [self._model_card(n) for n in self._ready()]})
            elif route[1] is Category.HEALTH:
                ready = self.server.ready
                await _send_json(send, 200 if ready else 503, {"ready": ready})
            else:
                name = path[11:]
                if name not in self._ready():
                    raise model_not_found(name)
                await _send_json(send, 200, self._model_card(name))
        except ApiError as exc:
            await send_error(send, exc)
        except KernelError as exc:
            await send_error(send, from_kernel(exc))
        except RecursionError:
            await send_error(send, bad_request("the request is nested too deeply"))
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the connection down
            log.exception("unexpected error handling %s %s", method, path)
            await send_error(send, ApiError(500, f"internal error: {type(exc).__name__}: {exc}", SERVER_ERROR))

    def _check_restriction(self, category: Category, scope) -> None:
        rule = self.restricted.get(category)
        if rule is None:
            return
        wanted = rule.header.encode("latin-1")
        for key, value in scope["headers"]:
            if key.lower() == wanted and value.decode("latin-1") == rule.value:
                return
        raise ApiError(401, f"This API is restricted, expecting header '{rule.header}' with valid value",
                       "authentication_error", None, "invalid_auth")

    def _check_key(self, scope) -> None:
        for key, value in scope["headers"]:
            if key == b"authorization":
                if hmac.compare_digest(value, self.api_key):
                    return
                raise ApiError(401, "Incorrect API key provided. The server was started with --openai-api-key; send "
                                    "that key as 'Authorization: Bearer KEY'.", INVALID_REQUEST, None,
                               "invalid_api_key")
        raise ApiError(401, "You didn't provide an API key. This server asks for one in an Authorization header "
                            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).", INVALID_REQUEST, None,
                       "invalid_api_key")

    # ---- models --------------------------------------------------------------------------------

    def _ready(self) -> list[str]:
        """The ready models these routes can serve (text generation or embeddings)."""
        names = []
        for name, entry in self.server.registry.entries.items():
            model = entry.latest_ready()
            if model is not None and serves_openai(model):
                names.append(name)
        return sorted(names)

    def _model_card(self, name: str) -> dict:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "kernel"}

    def resolve(self, name: str):
        """The latest ready version of model `name`; 404 model_not_found otherwise."""
        entry = self.server.registry.entries.get(name)
        model = entry.latest_ready() if entry is not None else None
        if model is None:
            raise model_not_found(name)
        return model

    def admit(self, model, requests: int) -> None:
        """Refuse work the server or the model cannot take now (see the module docstring)."""
        held = self.server.held_output
        if held.over_limit:
            raise ApiError(503, held.refusal(), SERVER_ERROR, None, "server_overloaded")
        limit = self._limits.get(model)
        if limit is None:
            limit = self._limits[model] = _inflight_limit(model)
        if limit:
            if requests > limit:
                raise bad_request(f"the request asks for {requests} choices; model '{model.name}' runs at most "
                                  f"{limit} requests at once (max_inflight_requests)", "n")
            busy = in_flight_everywhere(model)  # (every front's, with several)
            if busy + requests > limit:
                raise too_many_requests(f"model '{model.name}' has {busy} requests in flight, its limit is {limit} "
                                        "(max_inflight_requests); retry later")

    # ---- bodies --------------------------------------------------------------------------------

    async def _body(self, scope, receive) -> Optional[bytes]:
        """The request body, at most --http-max-input-size bytes (413 past it); None: the client left."""
        limit = self.max_input_size
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise bad_request("Invalid Content-Length header: not an integer", code="invalid_content_length")
                if length > limit:
                    raise _too_large(length, limit)
                break
        return await read_body(receive, limit, _refuse_large)

    async def off_loop(self, size: int, fn, *args):
        """fn(*args), in a thread when the body it works on is large."""
        if size <= OFFLOAD_BYTES:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    # ---- completions ---------------------------------------------------------------------------

    async def _completion(self, chat: Optional[bool], scope, receive, send) -> None:
        """A chat (True), text completion (False) or Responses API (None) call."""
        scope["kernel.openai_start"] = time.monotonic()
        started = tracing.start_ns(self.server)
        body = await self._body(scope, receive)
        if body is None:
            return
        size = len(body)
        kind = schema.ChatRequest if chat else schema.CompletionRequest if chat is False else responses.ResponsesRequest
        request, fields = await self.off_loop(size, schema.decode, body, kind)
        trace = tracing.CallTrace.sample(self.server, request.model, scope["headers"], started) if started else None
        try:
            if chat is None:
                generation = await self._responses(request, fields, size, scope, trace)
            else:
                generation = await self._submitted(chat, request, fields, size, scope, trace)
            del body, request, fields  # the choices share what they need of them (Generation.prepare)
            await self._answer(generation, receive, send)
        finally:
            if trace is not None:
                trace.finish()

    async def _answer(self, generation: Generation, receive, send) -> None:
        watcher = asyncio.ensure_future(_watch_disconnect(receive, generation))
        self.streams.add(generation)
        try:
            if generation.stream:
                await generation.write_stream(send)
                return
            await generation.wait_all()
            if generation.closed:
                return
            if generation.error is not None:
                await send_error(send, generation.error)
                return
            text_size = sum(len(part) for parts in generation.texts for part in parts)
            await _send_body(send, 200, _JSON, await self.off_loop(text_size, generation.answer))
        finally:
            watcher.cancel()
            self.streams.discard(generation)
            if not generation.finished:
                generation.cancel()

    async def _submitted(self, chat: bool, request, fields: dict, size: int, scope, trace) -> Generation:
        """The call's choices, submitted; ApiError when the request or the model refuses. `size`:
        the body's; `trace`: the call's tracing.CallTrace when it was sampled."""
        features.platform_fields(request)
        if chat:
            schema.check_chat(request)
            asks = features.chat_asks(request)
        else:
            prompts = schema.check_completion(request)
            asks = features.completion_asks(request)
        model = self.resolve(request.model)
        tm = text_model(model)
        features.check(tm, asks)
        stream = bool(request.stream)
        options = request.stream_options
        include_usage = stream and options is not None and options.include_usage
        if chat:
            prompt = await self.chat_prompt(model, request.messages, size, features.tools_of(request),
                                            request.add_generation_prompt, request.chat_template_kwargs)
            prompts = [prompt]
            form = ChatForm(request.model, include_usage, bool(request.functions))
        else:
            form = CompletionForm(request.model, include_usage)
        return await self.generate(model, tm, form, prompts, request, schema.sampling_parameters(
            fields, request, features.delivered(request, fields, tm)), size, scope, trace, stream,
            bool(getattr(request, "echo", False)), "logprobs" in asks)

    async def _responses(self, request, fields: dict, size: int, scope, trace) -> Generation:
        """A /v1/responses call's one choice, submitted (responses.py says how it maps to chat)."""
        view, asks, response_format = responses.check(request)
        model = self.resolve(request.model)
        tm = text_model(model)
        features.check(tm, asks)
        prompt = await self.chat_prompt(model, responses.messages(request), size, features.tools_of(view), True, None)
        sampling = responses.sampling(fields, request, view, response_format)
        return await self.generate(model, tm, responses.ResponsesForm(request.model, request), [prompt],
                                   _Limits(request.max_output_tokens, request.seed), sampling, size, scope, trace,
                                   bool(request.stream))

    async def chat_prompt(self, model, messages, size: int, tools, add_generation_prompt, kwargs) -> str:
        """The prompt the model's chat template (or the plain one) makes of a call's messages."""
        template = await chat_template.template_for(model)
        entries = chat_template.messages_for_template(messages)
        generation_prompt = add_generation_prompt is not False
        if template.text is None:
            return await self.off_loop(size, chat_template.plain_prompt, entries, generation_prompt)
        return await self.templates.render(template, entries, size, tools, generation_prompt, kwargs)

    async def generate(self, model, tm, form, prompts: list, request, sampling: dict, size: int, scope, trace,
                       stream: bool, echo: bool = False, logprobs: bool = False) -> Generation:
        """Submit the choices of a call whose prompts are made (`request`: its n, seed, max tokens)."""
        n = getattr(request, "n", None) or 1
        schema.choices_limit(len(prompts), n)
        self.admit(model, len(prompts) * n)
        generation = Generation(self.server, form.model_name, tm, form, prompts, n, schema.max_tokens(request), echo,
                                self.max_json_output_size, logprobs)
        generation.transport = scope.get("kernel.transport")
        generation.trace = trace
        watch = generation.watch = self.metrics.watch(model, len(generation.choices), n)
        watch.start = scope.get("kernel.openai_start", watch.start)
        await self.off_loop(size, generation.prepare, sampling, getattr(request, "seed", None), self.max_input_size)
        await generation.submit(stream)
        return generation

    def end_all(self, reason: str) -> int:
        """End every call still generating with an error naming `reason` (the exit timeout is spent):
        an error event closes a stream, a 503 answers the others. Returns how many were ended."""
        return sum(generation.end(reason) for generation in list(self.streams))

    def cut_all(self) -> None:
        """Reset the clients of the calls still open (they did not take even their last event)."""
        for generation in list(self.streams):
            generation.disconnected()
            reset(generation.transport)


async def _watch_disconnect(receive, generation: Generation) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            generation.disconnected()
            return


class _Limits:
    """What Generation reads of a request besides its prompts (n, seed, max tokens), for a
    Responses API call."""

    __slots__ = ("n", "seed", "max_tokens")

    def __init__(self, max_tokens, seed) -> None:
        self.n = 1
        self.seed = seed
        self.max_tokens = max_tokens


def _inflight_limit(model) -> int:
    parameters = model.config.parameters
    if "max_inflight_requests" not in parameters:
        return 0
    text = parameters["max_inflight_requests"].string_value.strip()
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        log.warning("model '%s': parameter max_inflight_requests '%s' is not a count; no limit", model.name, text)
        return 0
    return value


def _refuse_large(size: int, limit: int) -> None:
    if size > limit:
        raise _too_large(size, limit)


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(413, f"Request size of {size} bytes exceeds the maximum allowed input size of {limit} bytes. "
                         "Use --http-max-input-size to increase the limit.", code="content_too_large")


async def _send_body(send, status: int, headers: list, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send, status: int, doc) -> None:
    await _send_body(send, status, _JSON, _json.encode(doc))


__all__ = ["OpenAIApp", "error_body", "route_of"]
