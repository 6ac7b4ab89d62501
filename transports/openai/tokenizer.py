"""POST /tokenize and /detokenize: a model's tokenizer, for models that name one.

vLLM's routes, for counting a prompt's tokens before sending it. A generator model provides them
by naming a tokenizer model in its config (`parameters { key: "tokenizer_model" value: {
string_value: "NAME" } }`); the tokenizer is any model of the repository, itself included (a
bound callable too), that answers with one response (a decoupled model sends one, final) and follows this convention:

    inputs   text (BYTES [1], optional)        the text to tokenize
             token_ids (INT64 [-1], optional)  the ids to turn back into text
    outputs  token_ids (INT64 or INT32 or UINT32 [-1])   the text's ids
             text (BYTES [1])                  the ids' text

Each request sends one of the two inputs. Bodies:

    /tokenize    {"model", "prompt"} or {"model", "messages", "add_generation_prompt"}
                 -> {"count", "max_model_len", "tokens"}  (messages go through the chat template)
    /detokenize  {"model", "tokens": [ids]} -> {"prompt"}

A model that names no tokenizer (or one that is not ready or does not follow the convention) is a
404 that names the model.
"""

from __future__ import annotations

import os
from typing import Annotated, Optional

import msgspec
import numpy as np
from msgspec import Meta, Struct

from kernel.core.errors import KernelError
from kernel.core.request import InferRequest, InferTensor, collect_single_response
from kernel.transports.openai import schema
from kernel.transports.openai.errors import ApiError, from_kernel

PARAMETER = "tokenizer_model"
MAX_IDS = 1 << 20
_json = msgspec.json.Encoder()


class TokenizeRequest(Struct, forbid_unknown_fields=False):
    model: str
    prompt: Optional[str] = None
    messages: Optional[Annotated[list[schema.Message], Meta(min_length=1)]] = None
    add_generation_prompt: Optional[bool] = None
    add_special_tokens: Optional[bool] = None


class DetokenizeRequest(Struct, forbid_unknown_fields=False):
    model: str
    tokens: Annotated[list[Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]], Meta(max_length=MAX_IDS)]


def _tokenizer(app, model):
    """The ready tokenizer model `model` names; ApiError 404 otherwise."""
    parameters = model.config.parameters
    name = parameters[PARAMETER].string_value.strip() if PARAMETER in parameters else ""
    if not name:
        raise ApiError(404, f"model '{model.name}' provides no tokenizer (its config names no '{PARAMETER}')",
                       param="model", code="tokenizer_not_found")
    entry = app.server.registry.entries.get(name)
    found = entry.latest_ready() if entry is not None else None
    if found is None:
        raise ApiError(404, f"the tokenizer of model '{model.name}', model '{name}', is not ready", param="model",
                       code="tokenizer_not_found")
    problem = []
    if "text" not in found.inputs or "token_ids" not in found.inputs:
        problem.append("the inputs 'text' and 'token_ids'")
    if "text" not in found.outputs or "token_ids" not in found.outputs:
        problem.append("the outputs 'text' and 'token_ids'")
    if problem:
        raise ApiError(404, f"the tokenizer of model '{model.name}', model '{name}', does not follow the tokenizer "
                            "convention: it needs " + " and ".join(problem), param="model", code="tokenizer_not_found")
    return found


async def _ask(app, tokenizer, tensor: InferTensor):
    if tokenizer.max_batch_size > 0:  # a batch of one
        tensor.shape = (1, *tensor.shape)
    request = InferRequest(tokenizer.name, tokenizer.version_str, "tok-" + os.urandom(8).hex(), [tensor])
    future = collect_single_response(request)
    try:
        app.server.submit(request)
        response = await future
    except KernelError as exc:
        raise from_kernel(exc, tokenizer.name) from None
    if response.error is not None:
        raise from_kernel(response.error, tokenizer.name)
    return response


async def handle(app, tokenize: bool, body: bytes) -> dict:
    size = len(body)
    request, _ = await app.off_loop(size, schema.decode, body, TokenizeRequest if tokenize else DetokenizeRequest)
    model = app.resolve(request.model)
    tokenizer = _tokenizer(app, model)
    if not tokenize:
        ids = np.asarray(request.tokens, dtype=np.int64)
        response = await _ask(app, tokenizer, InferTensor("token_ids", "INT64", ids.shape, raw=ids.tobytes()))
        text = response.output("text")
        values = text.as_numpy().reshape(-1) if text is not None else []
        value = values[0] if len(values) else b""
        return {"prompt": value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)}
    if (request.prompt is None) == (request.messages is None):
        raise ApiError(400, "send either 'prompt' or 'messages'", param="prompt")
    if request.prompt is not None:
        prompt = request.prompt
    else:
        prompt = await app.chat_prompt(model, request.messages, size, None, request.add_generation_prompt, None)
    data = prompt.encode("utf-8")
    response = await _ask(app, tokenizer, InferTensor("text", "BYTES", (1,), raw=len(data).to_bytes(4, "little")
                                                      + data))
    ids = response.output("token_ids")
    tokens = [int(v) for v in ids.as_numpy().reshape(-1)] if ids is not None else []
    parameters = model.config.parameters
    context = parameters["context_length"].string_value.strip() if "context_length" in parameters else ""
    max_len = int(context) if context.isdigit() else None
    return {"count": len(tokens), "max_model_len": max_len, "tokens": tokens}
