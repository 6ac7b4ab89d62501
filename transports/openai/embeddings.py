"""POST /v1/embeddings: each input text is one request to a model that answers once with a vector.

`encoding_format` "float" answers lists of numbers; "base64" (what the `openai` client asks for
unless told otherwise) answers each vector's little-endian float32 bytes in base64. `usage`
counts the model's `num_input_tokens` when it has that output, else 0.

The answer is written a piece at a time, beside the event loop when it is large (2,048 vectors of
4,096 numbers froze the front for up to 2.8 s when converted on it, issue 31), and refused with a
400 naming --http-max-json-output-size once it would pass that limit.
"""

from __future__ import annotations

import asyncio
import binascii
import os

import msgspec

from kernel.core.datatypes import element_count
from kernel.core.errors import KernelError
from kernel.core.request import collect_single_response
from kernel.transports.http import large_json
from kernel.transports.http.large_json import PIECE_ELEMENTS
from kernel.transports.openai import schema
from kernel.transports.openai.convention import embedding_model
from kernel.transports.openai.errors import answer_too_large, bad_request, from_kernel, send_error
from kernel.transports.openai.tracing import CallTrace

_json = msgspec.json.Encoder()


async def handle(app, body: bytes, scope, receive, send, started_ns: int = 0) -> None:
    """`started_ns`: when the call began, when tracing may sample it (tracing.start_ns)."""
    request, _ = await app.off_loop(len(body), schema.decode, body, schema.EmbeddingRequest)
    del body
    trace = CallTrace.sample(app.server, request.model, scope["headers"], started_ns) if started_ns else None
    try:
        await _embed(app, request, receive, send, trace)
    finally:
        if trace is not None:
            trace.finish()


async def _embed(app, request, receive, send, trace) -> None:
    if request.encoding_format not in ("float", "base64", None):
        raise bad_request(f"encoding_format must be 'float' or 'base64', not '{request.encoding_format}'",
                          "encoding_format")
    if request.dimensions is not None:
        raise bad_request("'dimensions' is not supported by Kernel's OpenAI API", "dimensions")
    model = app.resolve(request.model)
    em = embedding_model(model)
    texts = [request.input] if isinstance(request.input, str) else request.input
    app.admit(model, len(texts))
    call_id = "emb-" + os.urandom(12).hex()
    requests = []
    futures = []
    try:
        for i, text in enumerate(texts):
            core_request = em.build(f"{call_id}-{i}", text.encode("utf-8"))
            if trace is not None:
                core_request.trace = trace.for_request(i)
            futures.append(collect_single_response(core_request))
            requests.append(core_request)
            app.server.submit(core_request)
    except KernelError as exc:
        for r in requests:
            r.cancel()
        raise from_kernel(exc, model.name) from None
    gathered = asyncio.gather(*futures)
    watcher = asyncio.ensure_future(_watch(receive, requests, gathered))
    try:
        try:
            responses = await gathered
        except asyncio.CancelledError:
            if watcher.done():
                return  # the client went away; its requests are cancelled
            raise
    finally:
        watcher.cancel()
    if trace is not None:
        trace.answered(responses[-1])
    for response in responses:
        if response.error is not None:
            await send_error(send, from_kernel(response.error, model.name))
            return
    answer = Answer(em, request.model, responses, request.encoding_format == "base64", app.max_json_output_size)
    del responses
    out = answer.encode() if answer.elements <= PIECE_ELEMENTS else await large_json.run(answer.encode)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]})
    await send({"type": "http.response.body", "body": out})


class Answer:
    """The JSON answer of an embeddings call, written into one buffer a piece at a time (on the
    JSON thread beside the loop when it is large: kernel.transports.http.large_json), and refused
    (400 naming --http-max-json-output-size) as soon as it would pass the limit."""

    def __init__(self, em, model_name: str, responses, base64_format: bool, limit: int) -> None:
        self.em = em
        self.model_name = model_name
        self.responses = responses
        self.base64_format = base64_format
        self.limit = limit
        self.elements = sum(_elements(em, r) for r in responses)

    def encode(self) -> bytearray:
        em, limit = self.em, self.limit
        tokens = sum(em.tokens(r) for r in self.responses)
        tail = (b'],"model":' + _json.encode(self.model_name) + b',"usage":'
                + _json.encode({"prompt_tokens": tokens, "total_tokens": tokens}) + b"}")
        count = len(self.responses)
        # At least: per vector its frame, and per number 2 characters ("0,") or 4/3 bytes of base64.
        least = len(_HEAD) + len(tail) + count * len(_ITEM) + (
            (4 * self.elements + 2) // 3 if self.base64_format else 2 * self.elements)
        if least > limit:
            raise answer_too_large(limit, "ask for fewer inputs")
        buf = bytearray(_HEAD)

        def check() -> None:
            if len(buf) > limit:
                raise answer_too_large(limit, "ask for fewer inputs")

        for i, response in enumerate(self.responses):
            if i:
                buf += b","
            buf += _ITEM % i
            vector = em.vector(response)
            if self.base64_format:
                data = memoryview(vector.astype("<f4", copy=False)).cast("B")
                buf += b'"'
                for start in range(0, len(data), _BASE64_PIECE):
                    buf += binascii.b2a_base64(data[start:start + _BASE64_PIECE], newline=False)
                    check()
                buf += b'"'
            else:
                buf += b"[]"
                large_json.values_into(buf, vector, check)
            buf += b"}"
            check()
        self.responses = ()
        buf += tail
        check()
        return buf


def _elements(em, response) -> int:
    tensor = response.output(em.output)
    return 0 if tensor is None else element_count(tensor.shape)


_HEAD = b'{"object":"list","data":['
_ITEM = b'{"object":"embedding","index":%d,"embedding":'
_BASE64_PIECE = 3 * large_json.PIECE_BYTES  # whole 3-byte groups: the pieces' base64 joins into the whole's


async def _watch(receive, requests, gathered) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            for r in requests:
                r.cancel()
            gathered.cancel()
            return
