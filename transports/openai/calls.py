"""A model's tool calls and log probabilities, read from its outputs into OpenAI's shapes.

Outputs (BYTES, one element per response, JSON text; a response without them adds none):

    tool_calls   the calls this response makes: a JSON array (or one object) of
                 {"name": str, "arguments": str or object, "id": str (optional)}, or OpenAI's own
                 {"id", "type": "function", "function": {"name", "arguments"}}. Each call is whole
                 in the response that carries it; a stream sends it as one delta. Kernel gives a
                 call without an id one (`call_...`), and an object's arguments as JSON text.
    logprobs     the tokens of this response's text: a JSON array of
                 {"token": str, "logprob": number, "top_logprobs": [{"token", "logprob"}, ...]}

A malformed output is the model's fault: the call fails with a 500 naming the output.
"""

from __future__ import annotations

import os
from typing import Optional

import msgspec

from kernel.transports.openai.errors import SERVER_ERROR, ApiError

MAX_CALLS = 128  # calls one choice may make
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def _bad(model: str, output: str, why: str) -> ApiError:
    return ApiError(500, f"model '{model}' answered an output '{output}' that Kernel cannot read: {why}",
                    SERVER_ERROR, None, "model_output")


def _json(data: bytes, model: str, output: str):
    try:
        return _decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _bad(model, output, f"not JSON ({exc})") from None


def tool_calls(values: list, model: str) -> list[dict]:
    """The calls in a response's `tool_calls` elements, as OpenAI's tool call objects."""
    out = []
    for data in values:
        if not data:
            continue
        doc = _json(data, model, "tool_calls")
        for call in doc if isinstance(doc, list) else [doc]:
            if not isinstance(call, dict):
                raise _bad(model, "tool_calls", "a call must be a JSON object")
            function = call.get("function") if isinstance(call.get("function"), dict) else call
            name = function.get("name")
            if not isinstance(name, str) or not name:
                raise _bad(model, "tool_calls", "a call needs a 'name'")
            arguments = function.get("arguments", "{}")
            if not isinstance(arguments, str):
                arguments = _encode(arguments).decode()
            call_id = call.get("id")
            if not isinstance(call_id, str) or not call_id:
                call_id = "call_" + os.urandom(12).hex()
            out.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return out


def logprobs(values: list, model: str) -> list[dict]:
    """The token entries in a response's `logprobs` elements, in the shape of chat's
    `logprobs.content` (token, logprob, bytes, top_logprobs)."""
    out = []
    for data in values:
        if not data:
            continue
        doc = _json(data, model, "logprobs")
        if not isinstance(doc, list):
            raise _bad(model, "logprobs", "it must be a JSON array of tokens")
        for entry in doc:
            out.append(_token(entry, model, True))
    return out


def _token(entry, model: str, top: bool) -> dict:
    if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
        raise _bad(model, "logprobs", "each token must be an object with a 'token' string")
    value = entry.get("logprob")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _bad(model, "logprobs", "each token needs a numeric 'logprob'")
    token = entry["token"]
    out = {"token": token, "logprob": float(value), "bytes": list(token.encode("utf-8"))}
    if top:
        tops = entry.get("top_logprobs") or []
        if not isinstance(tops, list):
            raise _bad(model, "logprobs", "'top_logprobs' must be an array")
        out["top_logprobs"] = [_token(t, model, False) for t in tops]
    return out


def completion_logprobs(entries: list[dict], offset: int = 0) -> dict:
    """Chat-shaped token entries in the shape of completions' `logprobs`; `offset`: where the
    first token starts in the choice's text."""
    tokens, values, tops, offsets = [], [], [], []
    for entry in entries:
        tokens.append(entry["token"])
        values.append(entry["logprob"])
        tops.append({t["token"]: t["logprob"] for t in entry.get("top_logprobs", ())})
        offsets.append(offset)
        offset += len(entry["token"])
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(entries: Optional[list]) -> Optional[dict]:
    return None if entries is None else {"content": entries, "refusal": None}
