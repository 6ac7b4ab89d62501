"""The OpenAI request bodies: decoded and checked once, with msgspec.

A body is decoded twice, in one pass each: to its fields as JSON text (msgspec.Raw, kept: every
field a model may read reaches it as sent, extensions like vLLM's `top_k` included, without ever
being built into Python objects), and to the typed structs below, which refuse wrong types and
out-of-range values with the JSON path of the field (`Expected `int` <= 128 - at `$.n``). Ranges are OpenAI's where it documents them; `max_tokens` is bounded by what a 32-bit
engine can hold, the model refuses what exceeds its own context.

`sampling_parameters` builds the vLLM convention's JSON string: every request field except those
that describe the call rather than the sampling (Triton's OpenAI frontend leaves out the same
ones), `max_tokens` from `max_completion_tokens` when given, no nulls.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import Meta, Struct

from kernel.transports.openai.errors import ApiError, bad_request

MAX_N = 128  # OpenAI's bound on choices per request
MAX_TOKENS = (1 << 31) - 1
MAX_STOP = 16
MAX_INPUTS = 2048  # prompts per completion request, inputs per embedding request (OpenAI's bound)

Tokens = Annotated[int, Meta(ge=1, le=MAX_TOKENS)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Stop = Union[str, Annotated[list[str], Meta(max_length=MAX_STOP)], None]


class StreamOptions(Struct, forbid_unknown_fields=False):
    include_usage: bool = False


class ContentPart(Struct, forbid_unknown_fields=False):
    type: str
    text: Optional[str] = None


MAX_TOOLS = 128  # OpenAI's bound on tools (and functions) per request
# A tool's or a function's name, as OpenAI allows it.
Name = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class FunctionDef(Struct, forbid_unknown_fields=False, omit_defaults=True):
    name: Name
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(Struct, forbid_unknown_fields=False, omit_defaults=True):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Struct, forbid_unknown_fields=False):
    name: str


class ToolChoice(Struct, forbid_unknown_fields=False):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Struct, forbid_unknown_fields=False, omit_defaults=True):
    name: Name
    description: Optional[str] = None
    schema: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ResponseFormat(Struct, forbid_unknown_fields=False):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class FunctionCall(Struct, forbid_unknown_fields=False):
    name: str
    arguments: str = ""


class ToolCall(Struct, forbid_unknown_fields=False):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class Message(Struct, forbid_unknown_fields=False):
    role: str
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[Annotated[list[ToolCall], Meta(max_length=MAX_TOOLS)]] = None
    tool_call_id: Optional[str] = None
    function_call: Optional[FunctionCall] = None


class _Sampling(Struct, forbid_unknown_fields=False):
    model: str
    max_tokens: Optional[Tokens] = None
    temperature: Optional[Annotated[float, Meta(ge=0.0, le=2.0)]] = None
    top_p: Optional[Annotated[float, Meta(ge=0.0, le=1.0)]] = None
    n: Optional[Annotated[int, Meta(ge=1, le=MAX_N)]] = None
    stop: Stop = None
    seed: Optional[int] = None  # -2**63 .. 2**64-1: checked in decode (msgspec bounds stop at int64)
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    # OpenAI's platform: accepted when they ask for nothing Kernel lacks (features.platform_fields).
    store: Optional[bool] = None
    metadata: Optional[dict[str, Any]] = None
    service_tier: Optional[str] = None
    modalities: Optional[list[str]] = None
    audio: Optional[Any] = None
    prediction: Optional[Any] = None


class ChatRequest(_Sampling, forbid_unknown_fields=False):
    messages: Annotated[list[Message], Meta(min_length=1)] = []
    max_completion_tokens: Optional[Tokens] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[Annotated[int, Meta(ge=0, le=20)]] = None
    tools: Optional[Annotated[list[Tool], Meta(max_length=MAX_TOOLS)]] = None
    tool_choice: Union[str, ToolChoice, None] = None
    parallel_tool_calls: Optional[bool] = None
    functions: Optional[Annotated[list[FunctionDef], Meta(max_length=MAX_TOOLS)]] = None
    function_call: Union[str, NamedFunction, None] = None
    response_format: Optional[ResponseFormat] = None
    # Delivered to the chat template (vLLM's extensions): the generation prompt, more template variables.
    add_generation_prompt: Optional[bool] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None


class CompletionRequest(_Sampling, forbid_unknown_fields=False):
    prompt: Union[str, Annotated[list[str], Meta(min_length=1, max_length=MAX_INPUTS)], None] = None
    echo: Optional[bool] = False
    logprobs: Optional[Annotated[int, Meta(ge=0, le=5)]] = None
    best_of: Optional[Annotated[int, Meta(ge=1, le=MAX_N)]] = None
    suffix: Optional[str] = None


class EmbeddingRequest(Struct, forbid_unknown_fields=False):
    model: str
    input: Union[str, Annotated[list[str], Meta(min_length=1, max_length=MAX_INPUTS)]]
    encoding_format: Optional[str] = "float"
    dimensions: Optional[Annotated[int, Meta(ge=1)]] = None
    user: Optional[str] = None


# Fields that describe the call, not the sampling: never part of sampling_parameters.
_NOT_SAMPLING = frozenset({
    "model", "messages", "prompt", "stream", "stream_options", "echo", "n", "user", "store", "metadata",
    "response_format", "service_tier", "tools", "tool_choice", "parallel_tool_calls", "function_call",
    "functions", "suffix", "max_completion_tokens", "max_tokens", "modalities", "audio", "prediction",
    "add_generation_prompt", "chat_template_kwargs",
})


_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_typed: dict = {}


def decode(body: bytes, kind: type):
    """(typed request, the body's fields as JSON text: {name: msgspec.Raw}); ApiError(400) naming
    what is wrong.

    The fields stay text: a field the typed struct does not know (vLLM's `top_k`, or two million
    integers from a hostile client) is never built into Python objects, only passed on as it was
    sent (issue 31: building and re-encoding them froze the front for seconds)."""
    if not body.strip():
        raise bad_request("the request body is empty: send a JSON object")
    try:
        fields = _fields.decode(body)
        if not body.isascii():  # skipped fields are not checked for UTF-8 by msgspec: check them all here
            str(body, "utf-8")
    except msgspec.ValidationError:
        raise bad_request("the request body must be a JSON object") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request("the request body is not valid JSON: it is nested too deeply") from None
    decoder = _typed.get(kind)
    if decoder is None:
        decoder = _typed[kind] = msgspec.json.Decoder(kind)
    try:
        typed = decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        raise bad_request(f"invalid request: {text}", _param(text)) from None
    except (msgspec.DecodeError, RecursionError):
        raise bad_request("invalid request: nested too deeply") from None
    seed = getattr(typed, "seed", None)
    if seed is not None and not -(1 << 63) <= seed < (1 << 64):
        raise bad_request("invalid request: 'seed' must be a 64-bit integer", "seed")
    return typed, fields


def _param(text: str) -> Optional[str]:
    """`...- at `$.messages[0].role`` -> "messages"."""
    _, sep, path = text.rpartition("- at `$.")
    if not sep:
        missing = "Object missing required field `"
        if missing in text:
            return text.split(missing, 1)[1].split("`", 1)[0]
        return None
    name = path.rstrip("`")
    for stop in ".[":
        name = name.split(stop, 1)[0]
    return name or None


def max_tokens(request) -> Optional[int]:
    """The completion length bound: chat's max_completion_tokens, else max_tokens."""
    return getattr(request, "max_completion_tokens", None) or request.max_tokens


def sampling_parameters(fields: dict, request, delivered: Optional[dict] = None) -> dict:
    """The sampling fields of a request (see the module docstring): {name: JSON text as sent}, and
    max_tokens as a number; `delivered`: the feature fields the model takes (features.delivered)."""
    out: dict[str, Any] = {k: v for k, v in fields.items() if k not in _NOT_SAMPLING and not _is_null(v)}
    if delivered:
        out.update(delivered)
    limit = max_tokens(request)
    if limit is not None:
        out["max_tokens"] = limit
    return out


def _is_null(raw: msgspec.Raw) -> bool:
    return len(raw) == 4 and bytes(raw) == b"null"


def offset_seed(seed: int, offset: int) -> int:
    """The seed of choice `offset` of a seeded call with n > 1: seeded choices differ from each
    other and stay reproducible."""
    return (seed + offset) % (1 << 64) if seed >= 0 else seed + offset


def check_chat(request: ChatRequest) -> None:
    if not request.messages:
        raise bad_request("'messages' must hold at least one message", "messages")


def check_completion(request: CompletionRequest) -> list[str]:
    """The prompts of a completion request (a string or a list of strings)."""
    prompt = request.prompt
    if prompt is None:
        raise bad_request("'prompt' is required", "prompt")
    if request.suffix:
        raise bad_request("'suffix' is not supported by Kernel's OpenAI API", "suffix")
    if request.best_of is not None and request.best_of != (request.n or 1):
        raise bad_request("'best_of' other than 'n' is not supported by Kernel's OpenAI API", "best_of")
    return [prompt] if isinstance(prompt, str) else list(prompt)


def choices_limit(prompts: int, n: int) -> None:
    if prompts * n > MAX_N:
        raise ApiError(400, f"a request may ask for at most {MAX_N} choices in all; {prompts} prompts x n={n} "
                            f"is {prompts * n}", param="n")
