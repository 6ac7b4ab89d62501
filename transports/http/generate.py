"""Triton's generate extension, and server-sent-event streaming of responses.

    POST /v2/models/<m>[/versions/<v>]/generate          one JSON object back
    POST /v2/models/<m>[/versions/<v>]/generate_stream   one SSE "data:" event per response

The request is a flat JSON object. Every top-level key, and every key inside
the optional "parameters" object, becomes an input tensor when the model has
an input of that name (its shape is fitted from the model's dims) and a
request parameter otherwise. The response object carries "id" (when the
request had one), "model_name", "model_version", the response parameters and
one key per output tensor (a single element is written as a scalar).

`stream_events` is the SSE machinery shared with the SageMaker transport's
/invocations-response-stream: responses go from request.on_response into an
asyncio.Queue and out as events; a client that disconnects cancels the request.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Optional

import msgspec

from kernel.core import datatypes
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor
from kernel.transports.asgi import JSON_HEADERS, send_error, send_response, start_stream, status_for
from kernel.transports.http import codec, large_json
from kernel.transports.http.disconnect import DisconnectWatch
from kernel.transports.reset import reset

SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
_PARAMETERS = "parameters"
_DISCONNECTED = object()
_OVERFLOW = object()  # queued once a stream holds more than MAX_PENDING_BYTES for its client
_EMPTY = object()
MAX_PENDING_BYTES = 16 * 1024 * 1024  # response data one stream may hold for a client that reads too slowly
_WATCH_BYTES = 64 * 1024  # response data waiting past which a stream joins the held-output account
_JOIN_BYTES = 256 * 1024  # waiting events joined into one write up to about this many bytes
_json = msgspec.json.Encoder()


def _bad(message: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, message)


# ---- streaming -----------------------------------------------------------------


def is_flag_only(response: InferResponse, decoupled: bool) -> bool:
    """A decoupled model's bare FINAL flag: it ends the stream and carries no data."""
    return (
        decoupled
        and response.final
        and response.error is None
        and not response.outputs
        and not response.parameters
    )


class ResponseQueue:
    """Collects a request's responses (set before submitting it).

    A stream's responses wait here until its client has taken the ones before them. Given the
    server's held-output account (`held`, kernel.core.holding) the queue is a holder in it while it
    holds more than _WATCH_BYTES of response data: a client that stops reading is cut after
    --client-stall-timeout-secs (a TCP reset of `transport`, its connection) and all clients
    together stay within --max-held-output-bytes. A model sends without waiting for the client, so
    one stream may hold at most MAX_PENDING_BYTES beyond the response being written: past that the
    request is cancelled, later responses are dropped, and the stream ends with an error event.
    """

    def __init__(self, request: InferRequest, held=None, transport=None):
        self.request = request
        self.queue: asyncio.Queue = asyncio.Queue()
        request.on_response = self._put
        self._watcher: Optional[DisconnectWatch] = None
        self._held = held
        self._transport = transport
        self.pending = 0  # bytes of response data waiting in the queue
        self._dropping = False  # overflowed or cut: later responses are not kept

    def _put(self, response: InferResponse) -> None:
        if self._dropping:
            return
        self.pending += _data_bytes(response)
        self.queue.put_nowait(response)
        if self._held is None or self.pending <= _WATCH_BYTES:
            return
        if self.pending > MAX_PENDING_BYTES and self.queue.qsize() > 1:
            self._dropping = True
            self.request.cancel()
            self.queue.put_nowait(_OVERFLOW)
        self._held.watch(self)

    def watch_disconnect(self, receive) -> None:
        """A client that goes away cancels the request and ends the wait."""
        self._watcher = DisconnectWatch(receive, self.request, lambda: self.queue.put_nowait(_DISCONNECTED))

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
        if self._held is not None:
            self._held.unwatch(self)

    async def get(self):
        """The next response (or _OVERFLOW), or None once the client has disconnected."""
        return self._taken(await self.queue.get())

    def waiting(self):
        """The next response if one is already waiting, else _EMPTY (None: the client disconnected)."""
        if self.queue.empty():
            return _EMPTY
        return self._taken(self.queue.get_nowait())

    def _taken(self, item):
        if item is _DISCONNECTED:
            return None
        if item is not _OVERFLOW:
            self.pending -= _data_bytes(item)
        return item

    # kernel.core.holding.Holder
    def held_bytes(self) -> int:
        return self.pending

    def cut(self, reason: str) -> None:
        """Drop the client (it stopped reading): cancel the request, free what waits, reset the connection."""
        self._dropping = True
        self.request.cancel()
        while not self.queue.empty():
            self.queue.get_nowait()
        self.pending = 0
        self.queue.put_nowait(_DISCONNECTED)
        reset(self._transport)


def _data_bytes(response: InferResponse) -> int:
    return sum(t.nbytes for t in response.outputs) if response.outputs else 0


def _overflow_event() -> bytes:
    return sse_event(codec.error_body(
        f"the client read the stream too slowly: more than {MAX_PENDING_BYTES} bytes of responses waited to be "
        "sent; the request was cancelled"))


def sse_event(doc_json: bytes) -> bytes:
    return b"data: " + doc_json + b"\n\n"


async def stream_events(
    responses: ResponseQueue,
    send,
    encode: Callable[[InferResponse], Any],
    decoupled: bool,
    extra_headers: tuple = (),
    transport=None,
    trace=None,
) -> None:
    """Send each response as an SSE event until the final one.

    As in Triton, the HTTP status is that of the first response (an error
    response first gives its error status); a later error arrives as an
    event carrying {"error": ...}, so clients must look at every event.
    The status, headers and first event leave in one segment (start_stream;
    transport: the connection, scope["kernel.transport"]). `trace`: the call's trace when it was
    sampled (the final response stamps INFER_RESPONSE_COMPLETE and HTTP_SEND_START on it).

    Responses that are already waiting when a write is due leave in that one write (each still its
    own event): a model that streams faster than the loop writes costs one write and one client
    wake-up per batch, not per token, so the front leaves the cores to the model and the client.
    The first response is never held back for the next.
    """
    started = False
    try:
        while True:
            response = await responses.get()
            if response is None:
                return  # client went away; the request is cancelled
            events = []
            size = 0
            final = False
            while True:
                if response is _OVERFLOW:
                    events.append(_overflow_event())
                    final = True
                    break
                final = response.final
                if trace is not None and final:
                    trace.on_response(response)
                    trace.stamp("HTTP_SEND_START")
                event = await _event(response, encode, decoupled)
                if event:
                    events.append(event)
                    size += len(event)
                if final or not started or size >= _JOIN_BYTES:
                    break
                response = responses.waiting()
                if response is None:
                    return
                if response is _EMPTY:
                    break
            data = b"".join(events)
            if not started:  # (then `response` is the first one: it left alone)
                started = True
                error = None if response is _OVERFLOW else response.error
                status = 200 if error is None else status_for(error)
                headers = [(b"content-type", SSE_CONTENT_TYPE), *extra_headers]
                await start_stream(send, transport, status, headers, data, not final)
                if final:
                    return
                continue
            if final:
                await send({"type": "http.response.body", "body": data, "more_body": False})
                return
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})
    finally:
        responses.close()


async def _event(response: InferResponse, encode, decoupled: bool) -> bytes:
    """One response's SSE event (b"" for a decoupled model's bare final flag)."""
    if is_flag_only(response, decoupled):
        return b""
    if response.error is not None:
        return sse_event(codec.error_body(response.error.message))
    try:
        data = encode(response)
        if inspect.isawaitable(data):
            data = await data
        return sse_event(data)
    except KernelError as exc:
        return sse_event(codec.error_body(exc.message))


# ---- the generate extension ------------------------------------------------------


async def handle_generate(app, name: str, version: str, streaming: bool, scope, receive, send) -> None:
    """Serve one generate / generate_stream call; KernelError before inference -> caller's JSON error.

    Traced as an infer request is (--trace-config; in OpenTelemetry mode a W3C traceparent
    header parents it): HTTP_RECV_START/END, the model's own timestamps, INFER_RESPONSE_COMPLETE
    and HTTP_SEND_START at the final response, HTTP_SEND_END once the answer is written."""
    tracer = app.tracer
    if tracer is None or not tracer.active:  # all that tracing costs while it is off
        await _generate(app, name, version, streaming, scope, receive, send, None)
        return
    trace = tracer.sample(name, tracer.context(scope["headers"]))
    if trace is None:
        await _generate(app, name, version, streaming, scope, receive, send, None)
        return
    trace.stamp("HTTP_RECV_START")
    try:
        await _generate(app, name, version, streaming, scope, receive, send, trace)
    finally:
        trace.stamp("HTTP_SEND_END")
        trace.release()


async def _generate(app, name: str, version: str, streaming: bool, scope, receive, send, trace) -> None:
    server = app.server
    model = server.model(name, version)
    body = await app.read_body(receive)
    if body is None:
        return  # client went away
    for key, value in scope["headers"]:
        if key == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            raise _bad("Unsupported content-encoding, only 'identity' is supported.")
    if trace is not None:
        trace.stamp("HTTP_RECV_END")
    if len(body) > large_json.INLINE_REQUEST_BYTES:  # beside the loop (see large_json)
        request = await large_json.run(build_generate_request, body, model, name, version)
    else:
        request = build_generate_request(body, model, name, version)
    del body
    limit = app.max_json_output_size

    async def encode(response: InferResponse):
        return await encode_bounded(response, limit)

    request.trace = trace
    responses = ResponseQueue(request, server.held_output, scope.get("kernel.transport")) if streaming \
        else ResponseQueue(request)
    server.submit(request)
    responses.watch_disconnect(receive)
    if streaming:
        await stream_events(responses, send, encode, model.decoupled,
                            transport=scope.get("kernel.transport"), trace=trace)
        return
    try:
        first: Optional[InferResponse] = None
        count = 0  # responses with data; only the first is kept (more than one is an error)
        while True:
            response = await responses.get()
            if response is None:
                return
            if not is_flag_only(response, model.decoupled):
                count += 1
                if first is None:
                    first = response
            if response.final:
                if trace is not None:
                    trace.on_response(response)
                    trace.stamp("HTTP_SEND_START")
                break
    finally:
        responses.close()
    if count != 1:
        # tritonserver 2.51's words; its status is 200 (the error only in the body), Kernel's 500:
        # a failed request must not read as a success (peer_checks/differences.py, generate-decoupled)
        await send_error(
            send,
            500,
            "generate expects model to produce exactly 1 response, use generate stream for model "
            "that generates various number of responses",
        )
        return
    response = first
    if response.error is not None:
        await send_error(send, status_for(response.error), response.error.message)
        return
    try:
        doc = await encode(response)
    except KernelError as exc:
        await send_error(send, status_for(exc), exc.message)
        return
    await send_response(send, 200, JSON_HEADERS, doc)


def build_generate_request(body: bytes, model, name: str, version: str) -> InferRequest:
    """The core request of a generate body (see the module docstring).

    The body is read as its fields' JSON text (one pass that builds nothing); an input's numbers
    longer than INLINE_REQUEST_BYTES are counted (for the shape) and read a piece at a time by
    large_json, never built into one Python list: run this on large_json's thread for a large body.
    Everything else is decoded as before, field by field."""
    fields: dict = {}
    if body.strip():
        try:
            fields = _fields.decode(body)
        except msgspec.ValidationError:
            raise _bad("failed to parse the request JSON buffer: the generate request must be a JSON object") from None
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise _bad(f"failed to parse the request JSON buffer: {exc}") from None
    request_id = _value(fields["id"]) if "id" in fields else ""
    if not isinstance(request_id, str):
        raise _bad("Unable to parse 'id': expected a string")
    batch = [-1] if model.max_batch_size > 0 else []
    shapes = {spec.name: (spec.datatype, batch + list(spec.dims)) for spec in model.inputs.values()}
    tensors: list[dict] = []
    params: dict[str, Any] = {}

    def take(key: str, raw: msgspec.Raw) -> None:
        if key in shapes:
            datatype, dims = shapes[key]
            count = _number_count(raw, datatype)
            if count is None:
                data = codec.flatten(_value(raw))
                count = len(data)
            else:
                data = raw  # read a piece at a time by large_json below
            tensors.append({"name": key, "datatype": datatype, "shape": _fit_shape(key, dims, count), "data": data})
            return
        value = _value(raw)
        if isinstance(value, (str, bool, int, float)):
            params[key] = value
        else:
            raise _bad(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")

    for key, raw in fields.items():
        if key == _PARAMETERS:
            if key in shapes:
                raise _bad(f"Keyword '{key}' for nested schema also given as input tensor name")
            try:
                nested = _fields.decode(raw)
            except msgspec.ValidationError:
                raise _bad(f"Expected JSON object for keyword: '{key}'") from None
            for k, v in nested.items():
                take(k, v)
        else:
            take(key, raw)
    inputs: list[InferTensor] = []
    if tensors:
        text = _json.encode({"inputs": tensors})
        decoded = large_json.decode_request(text, None) if len(text) > large_json.INLINE_REQUEST_BYTES else None
        parsed, _, _ = codec.parse_infer_request(text, None, name, version, decoded=decoded)
        inputs = parsed.inputs
    return InferRequest(name, version, request_id, inputs, None, params)


_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _value(raw: msgspec.Raw) -> Any:
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise _bad(f"failed to parse the request JSON buffer: {exc}") from None


def _number_count(raw: msgspec.Raw, datatype: str) -> Optional[int]:
    """How many numbers a long JSON array of numbers holds (one more than its commas: every comma
    separates two siblings, and an array without empty arrays inside has as many leaves as
    siblings minus its nested arrays), or None to decode it as a value (short, strings, empty
    arrays, not an array)."""
    if datatype == "BYTES" or len(raw) <= large_json.INLINE_REQUEST_BYTES:
        return None
    text = bytes(raw)
    if text[:1] != b"[" or b'"' in text or large_json.has_empty_array(text):
        return None
    return text.count(b",") + 1


def _fit_shape(name: str, dims: list[int], count: int) -> list[int]:
    """Fit `count` elements to the model's dims: fixed dims first, the innermost -1 takes the rest."""
    shape = list(dims)
    remaining = count
    for d in reversed(shape):
        if d != -1:
            if d == 0 or remaining % d:
                raise _bad(f"The schema can not convert input '{name}' to tensor with proper shape")
            remaining //= d
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i] = remaining
            remaining = 1
    if remaining != 1 and count != 0:
        raise _bad(f"The schema can not convert input '{name}' to tensor with proper shape")
    return shape


async def encode_bounded(response: InferResponse, limit: int):
    """A generate answer's JSON, at most `limit` bytes (--http-max-json-output-size; 400 past it);
    an answer with many elements is written on the JSON thread beside the loop."""
    if sum(t.nbytes for t in response.outputs) <= large_json.PIECE_BYTES:
        return encode_generate_answer(response, limit)
    return await large_json.run(encode_generate_answer, response, limit)


def encode_generate_answer(response: InferResponse, limit: Optional[int]) -> bytearray:
    """The answer object, keys sorted, each output written a piece at a time (a single element as a
    scalar); KernelError once the JSON would pass `limit` bytes (None: no limit)."""
    fields: dict[str, Any] = {}
    if response.id:
        fields["id"] = response.id
    fields["model_name"] = response.model_name
    fields["model_version"] = response.model_version
    for key, value in (response.parameters or {}).items():
        if not isinstance(value, (str, bool, int, float)):
            raise KernelError(
                ErrorCode.UNSUPPORTED, f"Response parameter '{key}' has a type that generate cannot return"
            )
        fields.setdefault(key, value)
    least = 0
    for tensor in response.outputs:
        if tensor.datatype == "BF16":
            raise KernelError(ErrorCode.UNSUPPORTED, f"output '{tensor.name}' is BF16, which generate cannot return")
        if tensor.name not in fields:
            fields[tensor.name] = tensor
            least += (3 if tensor.datatype == "BYTES" else 2) * datatypes.element_count(tensor.shape)
    if limit is not None and least > limit:
        raise _too_large(response.model_name, limit)

    def check() -> None:
        if limit is not None and len(buf) > limit:
            raise _too_large(response.model_name, limit)

    buf = bytearray(b"{")
    for i, key in enumerate(sorted(fields)):
        if i:
            buf += b","
        _json.encode_into(key, buf, -1)
        buf += b":"
        value = fields[key]
        if not isinstance(value, InferTensor):
            _json.encode_into(value, buf, -1)
        elif datatypes.element_count(value.shape) == 1:
            _json.encode_into(codec.json_data(value)[0], buf, -1)
        else:
            buf += b"[]"
            large_json.values_into(buf, value.as_numpy().reshape(-1), check, value.datatype == "BYTES")
        check()
    buf += b"}"
    check()
    return buf


def _too_large(model: str, limit: int) -> KernelError:
    return _bad(f"the answer of model '{model}' would take more than {limit} bytes as JSON "
                "(--http-max-json-output-size); generate answers only JSON: ask for its large outputs as binary "
                "data on the infer endpoint")


# ---- KServe v2 inference as an event stream (SageMaker /invocations-response-stream) ----


async def handle_infer_stream(app, name: str, version: str, header_length: Optional[int], receive, send,
                              transport=None) -> None:
    """Run a KServe v2 infer request and stream each response as an SSE event of KServe v2 JSON
    (`transport`: the connection, scope["kernel.transport"])."""
    server = app.server
    model = server.model(name, version)
    body = await app.read_body(receive)
    if body is None:
        return
    request, _, _ = codec.parse_infer_request(body, header_length, name, version)
    responses = ResponseQueue(request, server.held_output, transport)
    server.submit(request)
    responses.watch_disconnect(receive)

    def encode(response: InferResponse) -> bytes:
        doc, _ = codec.encode_infer_response(response, False, {})
        return doc

    await stream_events(responses, send, encode, model.decoupled, transport=transport)


__all__ = [
    "ResponseQueue",
    "build_generate_request",
    "encode_bounded",
    "encode_generate_answer",
    "handle_generate",
    "handle_infer_stream",
    "stream_events",
]
