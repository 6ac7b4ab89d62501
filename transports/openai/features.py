"""What a model declares it can do beyond text, and the request fields that ask for it.

Nothing a client sends is dropped on the way: a field either reaches the model or is refused with
a 400 that names it. Three groups of fields ask the model for more than text, and reach it only
when its config declares it can do that (the parameter `openai_supports`, a comma-separated list):

    tools             tools, tool_choice, parallel_tool_calls (and the older functions,
                      function_call, delivered as tools and tool_choice); the model answers its
                      calls in a BYTES output `tool_calls` (calls.py says the format)
    response_format   response_format of type json_object or json_schema
    logprobs          chat's logprobs / top_logprobs, completions' logprobs; the model answers
                      them in a BYTES output `logprobs`

A model that declares `tools` or `logprobs` without its output has them refused, the 400 saying
what is missing. Delivered fields are in `sampling_parameters` as the client sent them (a model
without that input: request parameters), so a model reads `tools` there as it reads `temperature`.
The template (chat_template.py) sees `tools` too, as transformers' apply_chat_template passes them.

Fields that describe OpenAI's platform rather than the answer are accepted when they ask for
nothing Kernel lacks (`user`; `store` false; `service_tier` auto or default; `modalities` text)
and refused otherwise (`store: true`, `metadata`, `audio`, `prediction`, other tiers or modalities).
"""

from __future__ import annotations

from typing import Any, Optional

import msgspec

from kernel.transports.openai.errors import ApiError, bad_request

PARAMETER = "openai_supports"
FEATURES = ("tools", "response_format", "logprobs")
# The output a feature's answers come in (response_format's come in text_output).
OUTPUTS = {"tools": "tool_calls", "logprobs": "logprobs"}
MAX_SCHEMA_DEPTH = 32  # nesting of a tool's parameters or a response_format schema
_TOOL_CHOICES = ("none", "auto", "required")
_RESERVED_TEMPLATE_NAMES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


def declared(model) -> tuple[frozenset, dict]:
    """(the features a model can serve, {feature: why it cannot} for the others)."""
    parameters = model.config.parameters
    text = parameters[PARAMETER].string_value if PARAMETER in parameters else ""
    named = {part.strip() for part in text.split(",") if part.strip()}
    supported = set()
    why = {}
    for feature in FEATURES:
        if feature not in named:
            why[feature] = (f"its config does not declare it (parameters {{ key: \"{PARAMETER}\" value: "
                            f"{{ string_value: \"{feature}\" }} }})")
            continue
        output = OUTPUTS.get(feature)
        spec = model.outputs.get(output) if output else None
        if output and (spec is None or spec.datatype != "BYTES"):
            why[feature] = f"it declares '{feature}' in {PARAMETER} but has no BYTES output '{output}'"
            continue
        supported.add(feature)
    return frozenset(supported), why


def refuse(model_name: str, feature: str, field: str, why: str) -> ApiError:
    what = {"tools": "tool calling", "response_format": "response_format", "logprobs": "logprobs"}[feature]
    return ApiError(400, f"model '{model_name}' does not support {what} ('{field}'): {why}", param=field,
                    code="unsupported_field")


# ---- the request --------------------------------------------------------------------------------


def platform_fields(request) -> None:
    """Refuse the platform fields that ask for what Kernel does not do (see the module docstring)."""
    if getattr(request, "store", None):
        raise bad_request("'store' is not supported: Kernel keeps no completions; send store false or leave it out",
                          "store")
    if getattr(request, "metadata", None):
        raise bad_request("'metadata' is not supported: it labels stored completions, and Kernel keeps none",
                          "metadata")
    tier = getattr(request, "service_tier", None)
    if tier not in (None, "auto", "default"):
        raise bad_request(f"'service_tier' '{tier}' is not supported: Kernel has one tier (auto or default)",
                          "service_tier")
    modalities = getattr(request, "modalities", None)
    if modalities and any(m != "text" for m in modalities):
        raise bad_request("'modalities' other than text are not supported", "modalities")
    for name in ("audio", "prediction"):
        if getattr(request, name, None) is not None:
            raise bad_request(f"'{name}' is not supported by Kernel's OpenAI API", name)


def chat_asks(request) -> dict:
    """{feature: the field that asks for it} of a chat request, after checking the fields agree
    with each other (a 400 naming the field otherwise)."""
    asks: dict[str, str] = {}
    tools, functions = request.tools, request.functions
    if tools and functions:
        raise bad_request("send either 'tools' or the older 'functions', not both", "functions")
    if tools:
        asks["tools"] = "tools"
        _check_choice(request.tool_choice, {t.function.name for t in tools})
        for i, tool in enumerate(tools):
            check_depth(tool.function.parameters, f"tools[{i}].function.parameters", "tools")
    elif request.tool_choice is not None:
        raise bad_request("'tool_choice' is only allowed when 'tools' are given", "tool_choice")
    if request.parallel_tool_calls is not None and not tools:
        raise bad_request("'parallel_tool_calls' is only allowed when 'tools' are given", "parallel_tool_calls")
    if functions:
        asks["tools"] = "functions"
        names = {f.name for f in functions}
        call = request.function_call
        if isinstance(call, str):
            if call not in ("none", "auto"):
                raise bad_request(f"'function_call' must be 'none', 'auto' or {{\"name\": ...}}, not '{call}'",
                                  "function_call")
        elif call is not None and call.name not in names:
            raise bad_request(f"'function_call' names '{call.name}', which is not one of the functions given",
                              "function_call")
        for i, f in enumerate(functions):
            check_depth(f.parameters, f"functions[{i}].parameters", "functions")
    elif request.function_call is not None:
        raise bad_request("'function_call' is only allowed when 'functions' are given", "function_call")
    fmt = request.response_format
    if fmt is not None:
        format_asks(fmt.type, fmt.json_schema, asks, "response_format")
    if request.top_logprobs is not None and not request.logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    if request.logprobs:
        asks["logprobs"] = "logprobs"
    kwargs = request.chat_template_kwargs
    if kwargs:
        reserved = sorted(_RESERVED_TEMPLATE_NAMES.intersection(kwargs))
        if reserved:
            raise bad_request(f"'chat_template_kwargs' may not set {', '.join(reserved)}: the request's own fields "
                              "do", "chat_template_kwargs")
        check_depth(kwargs, "chat_template_kwargs", "chat_template_kwargs")
    return asks


def format_asks(kind: str, json_schema, asks: dict, field: str) -> None:
    """A response format of `kind` (text, json_object, json_schema) asks for the feature unless it is text."""
    if kind == "json_schema":
        if json_schema is None:
            raise bad_request(f"'{field}' of type json_schema needs its 'json_schema'", field)
        check_depth(json_schema.schema, f"{field}.json_schema.schema", field)
    if kind != "text":
        asks["response_format"] = field


def completion_asks(request) -> dict:
    return {"logprobs": "logprobs"} if request.logprobs is not None else {}


def _check_choice(choice, names: set) -> None:
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICES:
            raise bad_request(f"'tool_choice' must be one of {', '.join(_TOOL_CHOICES)} or a function, not '{choice}'",
                              "tool_choice")
        return
    if choice.function.name not in names:
        raise bad_request(f"'tool_choice' names the function '{choice.function.name}', which is not one of the "
                          "tools given", "tool_choice")


def check_depth(value: Any, where: str, field: str, limit: int = MAX_SCHEMA_DEPTH) -> None:
    """Refuse a JSON value nested more than `limit` levels (a schema no model needs, and that every
    consumer downstream would walk recursively)."""
    if not isinstance(value, (dict, list)):
        return
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise bad_request(f"'{where}' is nested more than {limit} levels deep", field)
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))


def check(tm, asks: dict) -> None:
    """Refuse what the model (convention.TextModel) cannot serve."""
    for feature, field in asks.items():
        if feature not in tm.supports:
            raise refuse(tm.name, feature, field, tm.unsupported[feature])


def delivered(request, fields: dict, tm) -> dict:
    """The feature fields that reach the model in sampling_parameters ({name: JSON text or value})."""
    out: dict[str, Any] = {}
    supports = tm.supports
    if "tools" in supports:
        for name in ("tools", "tool_choice", "parallel_tool_calls"):
            raw = fields.get(name)
            if raw is not None and bytes(raw) != b"null":
                out[name] = raw
        if getattr(request, "functions", None):
            out["tools"] = tools_of(request)
            call = request.function_call
            if call is not None:
                out["tool_choice"] = call if isinstance(call, str) else {"type": "function",
                                                                       "function": {"name": call.name}}
    if "response_format" in supports:
        raw = fields.get("response_format")
        if raw is not None and bytes(raw) != b"null":
            out["response_format"] = raw
    return out


def tools_of(request) -> Optional[list]:
    """The request's tools as the chat template sees them (the older functions as tools), or None."""
    tools = getattr(request, "tools", None)
    if tools:
        return msgspec.to_builtins(tools)
    functions = getattr(request, "functions", None)
    if functions:
        return [{"type": "function", "function": f} for f in msgspec.to_builtins(functions)]
    return None
