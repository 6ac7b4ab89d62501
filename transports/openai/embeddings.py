"""POST /v1/embeddings: each input text is one request to a model that answers once with a vector.

`encoding_format` "float" answers lists of numbers; "base64" (what the `openai` client asks for
unless told otherwise) answers each vector's little-endian float32 bytes in base64. `usage`
counts the model's `num_input_tokens` when it has that output, else 0.
"""

from __future__ import annotations

import asyncio
import base64
import os

import msgspec

from kernel.core.errors import KernelError
from kernel.core.request import collect_single_response
from kernel.transports.openai import schema
from kernel.transports.openai.convention import embedding_model
from kernel.transports.openai.errors import bad_request, from_kernel, send_error

_json = msgspec.json.Encoder()


async def handle(app, body: bytes, receive, send) -> None:
    request, _ = await app.off_loop(len(body), schema.decode, body, schema.EmbeddingRequest)
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
    data = []
    tokens = 0
    base64_format = request.encoding_format == "base64"
    for i, response in enumerate(responses):
        if response.error is not None:
            await send_error(send, from_kernel(response.error, model.name))
            return
        vector = em.vector(response)
        tokens += em.tokens(response)
        value = base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii") if base64_format else vector.tolist()
        data.append({"object": "embedding", "index": i, "embedding": value})
    doc = {"object": "list", "data": data, "model": request.model,
           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    out = await app.off_loop(len(texts) * 1024, _json.encode, doc)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]})
    await send({"type": "http.response.body", "body": out})


async def _watch(receive, requests, gathered) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            for r in requests:
                r.cancel()
            gathered.cancel()
            return
