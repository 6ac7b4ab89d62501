"""POST /v1/responses: OpenAI's Responses API in front of the same models as chat completions.

A call is a chat call with one choice: `input` (a string: one user message; or a list of input
items: messages with text content, `function_call` items an assistant made and
`function_call_output` items with their results), `instructions` (a system message first), through
the model's chat template; `max_output_tokens` is max_tokens; `tools` (type function only),
`tool_choice` and `parallel_tool_calls`, and `text.format` (json_object, json_schema) reach the
model as chat's tools, tool_choice and response_format do, and need the same declarations
(features.py); `temperature`, `top_p` and extensions (vLLM's `top_k`, ...) are sampling fields.
Kernel keeps no responses: `store` is accepted and answered false, `previous_response_id`,
`conversation`, `prompt`, `background`, `reasoning`, `include` and `top_logprobs` are refused.

The answer is a `response` object whose `output` holds a `message` item (its text as one
`output_text` part) and a `function_call` item per tool call; `status` is "incomplete" with
`incomplete_details.reason` "max_output_tokens" when the model stopped there. `stream: true` sends
the typed events (`event: <type>` and the event as data, numbered by `sequence_number`):
response.created, response.in_progress, then per item output_item.added, content_part.added,
output_text.delta..., output_text.done, content_part.done, output_item.done (a function call:
output_item.added, function_call_arguments.delta, function_call_arguments.done, output_item.done),
and response.completed (or response.incomplete). An error after the first event is an `error` event.
"""

from __future__ import annotations

import os
import time
from typing import Annotated, Any, Literal, Optional, Union

import msgspec
from msgspec import Meta, Struct

from kernel.transports.openai import features
from kernel.transports.openai.convention import finish_reason
from kernel.transports.openai.errors import bad_request
from kernel.transports.openai.schema import (
    MAX_INPUTS, MAX_TOOLS, FunctionCall, FunctionDef, Message, Name, Tokens, ToolCall,
)

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder().decode


class InputPart(Struct, forbid_unknown_fields=False):
    type: str
    text: Optional[str] = None


class InputItem(Struct, forbid_unknown_fields=False):
    type: str = "message"
    role: Optional[str] = None
    content: Union[str, list[InputPart], None] = None
    call_id: Optional[str] = None
    name: Optional[str] = None
    arguments: Optional[str] = None
    output: Union[str, list[InputPart], None] = None


class ResponsesTool(Struct, forbid_unknown_fields=False, omit_defaults=True):
    type: Literal["function"]
    name: Name
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class NamedTool(Struct, forbid_unknown_fields=False):
    type: Literal["function"]
    name: str


class TextFormat(Struct, forbid_unknown_fields=False, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[Name] = None
    description: Optional[str] = None
    schema: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class TextConfig(Struct, forbid_unknown_fields=False):
    format: Optional[TextFormat] = None


class ResponsesRequest(Struct, forbid_unknown_fields=False):
    model: str
    input: Union[str, Annotated[list[InputItem], Meta(min_length=1, max_length=MAX_INPUTS)]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[Tokens] = None
    temperature: Optional[Annotated[float, Meta(ge=0.0, le=2.0)]] = None
    top_p: Optional[Annotated[float, Meta(ge=0.0, le=1.0)]] = None
    stream: Optional[bool] = False
    tools: Optional[Annotated[list[ResponsesTool], Meta(max_length=MAX_TOOLS)]] = None
    tool_choice: Union[str, NamedTool, None] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[TextConfig] = None
    store: Optional[bool] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    seed: Optional[int] = None
    truncation: Optional[Literal["auto", "disabled"]] = None
    service_tier: Optional[str] = None
    previous_response_id: Optional[str] = None
    conversation: Optional[Any] = None
    prompt: Optional[Any] = None
    background: Optional[bool] = None
    reasoning: Optional[Any] = None
    include: Optional[list[str]] = None
    top_logprobs: Optional[int] = None


# Fields that describe the call: never sampling fields (the others are, as in chat).
_NOT_SAMPLING = frozenset({
    "model", "input", "instructions", "max_output_tokens", "stream", "tools", "tool_choice", "parallel_tool_calls",
    "text", "store", "metadata", "user", "truncation", "service_tier", "previous_response_id", "conversation",
    "prompt", "background", "reasoning", "include", "top_logprobs", "stream_options", "max_tool_calls",
    "prompt_cache_key", "safety_identifier",
})
_REFUSED = {
    "previous_response_id": "Kernel keeps no responses to continue from: send the whole conversation as input",
    "conversation": "Kernel keeps no conversations: send the whole conversation as input",
    "prompt": "stored prompts are not supported: send the text as input",
    "reasoning": "reasoning settings are not supported by Kernel's OpenAI API",
    "include": "no extra output data (include) is supported by Kernel's OpenAI API",
    "top_logprobs": "log probabilities are not supported on /v1/responses; use /v1/chat/completions",
}


class ChatView:
    """A Responses request as the chat path reads it (features.chat_asks, check, delivered)."""

    def __init__(self, request: ResponsesRequest) -> None:
        self.tools = None
        if request.tools:
            self.tools = [_chat_tool(t) for t in request.tools]
        choice = request.tool_choice
        self.tool_choice = choice
        if isinstance(choice, NamedTool):
            self.tool_choice = msgspec.convert({"type": "function", "function": {"name": choice.name}},
                                               _ChatChoice)
        self.parallel_tool_calls = request.parallel_tool_calls
        self.functions = None
        self.function_call = None
        self.response_format = None
        self.top_logprobs = None
        self.logprobs = None
        self.chat_template_kwargs = None


class _ChatFunction(Struct):
    name: str


class _ChatChoice(Struct):
    type: str
    function: _ChatFunction


class _ChatTool(Struct, omit_defaults=True):
    type: str
    function: FunctionDef


def _chat_tool(tool: ResponsesTool) -> _ChatTool:
    return _ChatTool("function", FunctionDef(tool.name, tool.description, tool.parameters, tool.strict))


def check(request: ResponsesRequest) -> tuple[ChatView, dict, Optional[dict]]:
    """(the request seen as chat, {feature: field}, the response_format the model gets or None);
    400 naming what cannot be served."""
    for name, why in _REFUSED.items():
        value = getattr(request, name)
        if value is not None and value != [] and value != {}:
            raise bad_request(f"'{name}' is not supported: {why}", name)
    if request.background:
        raise bad_request("'background' is not supported: answers stream or come whole", "background")
    features.platform_fields(_Platform(request.service_tier))
    view = ChatView(request)
    asks = features.chat_asks(view)
    fmt = request.text.format if request.text is not None else None
    response_format = None
    if fmt is not None:
        if fmt.type == "json_schema" and not fmt.name:
            raise bad_request("'text.format' of type json_schema needs its 'name'", "text")
        schema = fmt.schema
        holder = None
        if fmt.type == "json_schema":
            holder = msgspec.convert({"name": fmt.name, "schema": schema or {}}, _SchemaHolder)
        features.format_asks(fmt.type, holder, asks, "text")
        if fmt.type != "text":
            response_format = {"type": fmt.type}
            if fmt.type == "json_schema":
                response_format["json_schema"] = msgspec.to_builtins(
                    {"name": fmt.name, "schema": schema, "strict": fmt.strict, "description": fmt.description})
                response_format["json_schema"] = {k: v for k, v in response_format["json_schema"].items()
                                                  if v is not None}
    return view, asks, response_format


class _Platform:
    def __init__(self, tier) -> None:
        self.service_tier = tier


class _SchemaHolder(Struct):
    name: str
    schema: dict[str, Any]


def messages(request: ResponsesRequest) -> list[Message]:
    """The conversation as chat messages (schema.Message), instructions first."""
    out: list[Message] = []
    if request.instructions:
        out.append(Message("system", request.instructions))
    if isinstance(request.input, str):
        out.append(Message("user", request.input))
        return out
    for i, item in enumerate(request.input):
        if item.type == "message":
            if item.role not in ("user", "assistant", "system", "developer"):
                raise bad_request(f"input[{i}]: a message's role must be user, assistant, system or developer",
                                  "input")
            out.append(Message(item.role, _text(item.content, i)))
        elif item.type == "function_call":
            if not item.call_id or not item.name:
                raise bad_request(f"input[{i}]: a function_call item needs its call_id and name", "input")
            call = ToolCall(item.call_id, FunctionCall(item.name, item.arguments or ""))
            if out and out[-1].role == "assistant" and out[-1].tool_calls is not None:
                out[-1].tool_calls.append(call)  # the calls of one turn: one assistant message
            else:
                out.append(Message("assistant", None, tool_calls=[call]))
        elif item.type == "function_call_output":
            if not item.call_id:
                raise bad_request(f"input[{i}]: a function_call_output item needs its call_id", "input")
            out.append(Message("tool", _text(item.output, i), tool_call_id=item.call_id))
        else:
            raise bad_request(f"input[{i}]: items of type '{item.type}' are not supported; send message, "
                              "function_call or function_call_output items", "input")
    return out


def _text(content, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.type not in ("input_text", "output_text", "text") or part.text is None:
            raise bad_request(f"input[{i}]: content parts of type '{part.type}' are not supported; send text",
                              "input")
        parts.append(part.text)
    return "\n".join(parts)


def sampling(fields: dict, request: ResponsesRequest, view: ChatView, response_format: Optional[dict]) -> dict:
    """The sampling fields the model gets (after features.check refused what it cannot take): the
    request's others as sent, max_tokens, and tools, tool_choice, response_format in chat's shapes,
    which a model reads alike whichever route the call came by."""
    out: dict[str, Any] = {k: v for k, v in fields.items() if k not in _NOT_SAMPLING and bytes(v) != b"null"}
    if view.tools:
        out["tools"] = view.tools
        if view.tool_choice is not None:
            out["tool_choice"] = view.tool_choice
        if request.parallel_tool_calls is not None:
            out["parallel_tool_calls"] = request.parallel_tool_calls
    if response_format is not None:
        out["response_format"] = response_format
    if request.max_output_tokens is not None:
        out["max_tokens"] = request.max_output_tokens
    return out


class ResponsesForm:
    """How a /v1/responses call's answer is written (see generation.Generation and forms.py)."""

    def __init__(self, model_name: str, request: ResponsesRequest) -> None:
        self.id = "resp_" + os.urandom(16).hex()
        self.created = int(time.time())
        self.model_name = model_name
        self.request = request
        self.seq = 0
        self.items: list[dict] = []  # the output items, in order
        self.message: Optional[dict] = None  # the message item being written
        self.text: list[str] = []

    # ---- the response object --------------------------------------------------------------

    def response(self, gen, status: str) -> dict:
        r = self.request
        usage = gen.usage() if gen is not None else None
        fmt = r.text.format if r.text is not None and r.text.format is not None else None
        choice = r.tool_choice
        out = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
            "incomplete_details": None, "instructions": r.instructions, "max_output_tokens": r.max_output_tokens,
            "model": self.model_name, "output": self.items if status != "in_progress" else [],
            "parallel_tool_calls": r.parallel_tool_calls is not False, "previous_response_id": None,
            "store": False, "temperature": r.temperature, "top_p": r.top_p,
            "text": {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}},
            "tool_choice": (msgspec.to_builtins(choice) if choice is not None else "auto"),
            "tools": msgspec.to_builtins(r.tools or []), "truncation": r.truncation or "disabled",
            "user": r.user, "metadata": r.metadata or {},
            "usage": None if usage is None else {
                "input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                "total_tokens": usage["total_tokens"],
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0}},
        }
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        return out

    def _status(self, gen) -> str:
        return "incomplete" if finish_reason(gen.choices[0], gen.max_tokens) == "length" else "completed"

    def answer(self, gen) -> dict:
        text = "".join(gen.texts[0])
        if text:
            self.items.append(_message_item(os.urandom(12).hex(), text, "completed"))
        for call in gen.choices[0].all_calls or ():
            self.items.append(_call_item(call, "completed"))
        return self.response(gen, self._status(gen))

    # ---- events ---------------------------------------------------------------------------

    def _event(self, kind: str, body: dict) -> bytes:
        body["type"] = kind
        body["sequence_number"] = self.seq
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + _json.encode(body) + b"\n\n"

    def opening(self, gen) -> bytes:
        snapshot = self.response(gen, "in_progress")
        snapshot["usage"] = None
        return (self._event("response.created", {"response": snapshot})
                + self._event("response.in_progress", {"response": snapshot}))

    def chunk(self, gen, index: int, text: str, final: bool) -> bytes:
        out = []
        if text:
            message = self.message
            if message is None:
                message = self.message = _message_item(os.urandom(12).hex(), "", "in_progress")
                message["content"] = []
                self.items.append(message)
                at = len(self.items) - 1
                out.append(self._event("response.output_item.added", {"output_index": at, "item": dict(message)}))
                out.append(self._event("response.content_part.added", {
                    "item_id": message["id"], "output_index": at, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}))
            self.text.append(text)
            out.append(self._event("response.output_text.delta", {
                "item_id": message["id"], "output_index": self.items.index(message), "content_index": 0,
                "delta": text, "logprobs": []}))
        calls = gen.choices[index].calls
        if calls:
            out.append(self._end_message())
            for call in calls:
                item = _call_item(call, "in_progress")
                self.items.append(item)
                at = len(self.items) - 1
                arguments = item["arguments"]
                out.append(self._event("response.output_item.added", {"output_index": at,
                                                                      "item": dict(item, arguments="")}))
                out.append(self._event("response.function_call_arguments.delta", {
                    "item_id": item["id"], "output_index": at, "delta": arguments}))
                out.append(self._event("response.function_call_arguments.done", {
                    "item_id": item["id"], "output_index": at, "arguments": arguments, "name": item["name"]}))
                item["status"] = "completed"
                out.append(self._event("response.output_item.done", {"output_index": at, "item": item}))
        return b"".join(out)

    def _end_message(self) -> bytes:
        message = self.message
        if message is None:
            return b""
        self.message = None
        text = "".join(self.text)
        self.text = []
        at = self.items.index(message)
        part = {"type": "output_text", "text": text, "annotations": []}
        message.update(content=[part], status="completed")
        return (self._event("response.output_text.done", {"item_id": message["id"], "output_index": at,
                                                           "content_index": 0, "text": text, "logprobs": []})
                + self._event("response.content_part.done", {"item_id": message["id"], "output_index": at,
                                                             "content_index": 0, "part": part})
                + self._event("response.output_item.done", {"output_index": at, "item": message}))

    def closing(self, gen) -> bytes:
        status = self._status(gen)
        end = self._end_message()
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return end + self._event(kind, {"response": self.response(gen, status)})

    def error_event(self, body: bytes) -> bytes:
        error = _decode(body).get("error", {})
        return self._event("error", {"code": error.get("code"), "message": error.get("message"),
                                     "param": error.get("param")})


def _message_item(suffix: str, text: str, status: str) -> dict:
    return {"type": "message", "id": "msg_" + suffix, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(call: dict, status: str) -> dict:
    return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": status}
