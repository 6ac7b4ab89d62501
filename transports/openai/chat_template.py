"""Chat messages to a prompt: the model's own chat template, or a plain documented one.

Where the template comes from, first found wins:

1. the model config's parameter `chat_template` (a Jinja2 template as text; how a bound callable
   sets one: `ModelConfig(backend_parameters={"chat_template": ...})`);
2. `chat_template.jinja` in the model's version folder, then in the model's folder;
3. `tokenizer_config.json` there: its `chat_template` (a string, or a list of named templates of
   which "default" is used), with its `bos_token` and `eos_token`.

A template is rendered as Hugging Face's `apply_chat_template` renders it: in Jinja2's immutable
sandbox, blocks trimmed (trim_blocks, lstrip_blocks), the loop-controls extension, a `tojson`
filter, `raise_exception(message)` (its message becomes the client's 400) and `strftime_now`;
variables `messages` (role and content, text parts joined by newlines; `name`, an assistant's
`tool_calls` with their `arguments` as an object when they are a JSON object, as transformers
asks of tool-use templates, a tool message's `tool_call_id`), `tools` (the request's tools, or its
older functions as tools; none: undefined), `add_generation_prompt` (the request's, default true),
`bos_token`, `eos_token`, and the request's `chat_template_kwargs`. It renders in a renderer
process, with a time and a size limit (template_pool.py, template_worker.py), with jinja2 (a
dependency of Kernel).

Without a template, the prompt is one line per message, `<role>: <content>` (an assistant's calls
follow its content as `name(arguments)`), and a last line `assistant:` that the model completes
(left out when add_generation_prompt is false).

Templates are read once per loaded model version, off the event loop; a failing template's
messages to the client never name a server path (the log does).
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from pathlib import Path
from typing import Optional

from kernel.transports.openai.errors import ApiError, bad_request

log = logging.getLogger("kernel.openai")


class ChatTemplate:
    """A model version's template: its text (None: the plain template), tokens, and where it came
    from (for the server's log only: a client never sees a server path)."""

    __slots__ = ("model", "source", "text", "bos_token", "eos_token", "__weakref__")

    def __init__(self, source: str, text: Optional[str], bos_token: str = "", eos_token: str = "",
                 model: str = "") -> None:
        self.model = model  # the model's name, for the server's log
        self.source = source
        self.text = text or None
        self.bos_token = bos_token
        self.eos_token = eos_token


def plain_prompt(messages: list[dict], add_generation_prompt: bool = True) -> str:
    lines = []
    for m in messages:
        line = f"{m['role']}: {m['content'] or ''}"
        for call in m.get("tool_calls", ()):
            arguments = call["function"]["arguments"]
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            line += f" {call['function']['name']}({arguments})"
        lines.append(line)
    if add_generation_prompt:
        lines.append("assistant:")
    return "\n".join(lines)


def _token(value) -> str:
    if isinstance(value, dict):  # a serialized AddedToken
        value = value.get("content", "")
    return value if isinstance(value, str) else ""


def load(model) -> ChatTemplate:
    """The model's chat template (file reads: call off the event loop)."""
    template = _load(model)
    template.model = model.name
    return template


def _load(model) -> ChatTemplate:
    parameters = model.config.parameters
    if "chat_template" in parameters and parameters["chat_template"].string_value:
        return ChatTemplate("the model config's parameter 'chat_template'", parameters["chat_template"].string_value)
    source = model.source
    for folder in (Path(source.version_dir), Path(source.model_dir)):
        jinja = folder / "chat_template.jinja"
        config = folder / "tokenizer_config.json"
        tokens: dict = {}
        if config.is_file():
            try:
                tokens = json.loads(config.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                log.error("model '%s': %s cannot be read: %s", model.name, config, exc)
                raise ApiError(500, "the model's tokenizer_config.json cannot be read", "server_error") from None
            if not isinstance(tokens, dict):
                tokens = {}
        bos, eos = _token(tokens.get("bos_token")), _token(tokens.get("eos_token"))
        if jinja.is_file():
            try:
                text = jinja.read_text(encoding="utf-8")
            except (OSError, ValueError) as exc:
                log.error("model '%s': %s cannot be read: %s", model.name, jinja, exc)
                raise ApiError(500, "the model's chat_template.jinja cannot be read", "server_error") from None
            return ChatTemplate(str(jinja), text, bos, eos)
        template = tokens.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if isinstance(template, str) and template:
            return ChatTemplate(str(config), template, bos, eos)
    return ChatTemplate("the plain template", None)


_loaded: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


async def template_for(model) -> ChatTemplate:
    """The model version's template, read on its first chat request (off the loop) and kept."""
    found = _loaded.get(model)
    if found is None:
        found = await asyncio.get_running_loop().run_in_executor(None, load, model)
        _loaded[model] = found
    return found


def messages_for_template(messages) -> list[dict]:
    """The request's messages as the template sees them; ApiError for content it cannot take."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            parts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise bad_request(f"messages[{i}]: content parts of type '{part.type}' are not supported; "
                                      "send text", "messages")
                parts.append(part.text)
            text = "\n".join(parts)
        entry = {"role": m.role, "content": text}
        if m.name is not None:
            entry["name"] = m.name
        if m.tool_calls:
            if content is None:
                entry["content"] = None
            entry["tool_calls"] = [{"id": c.id, "type": c.type, "function": {
                "name": c.function.name, "arguments": _arguments(c.function.arguments)}} for c in m.tool_calls]
        elif m.function_call is not None:  # the older form of one call
            entry["function_call"] = {"name": m.function_call.name,
                                      "arguments": _arguments(m.function_call.arguments)}
        if m.tool_call_id is not None:
            entry["tool_call_id"] = m.tool_call_id
        out.append(entry)
    return out


def _arguments(text: str):
    """A call's arguments as templates take them: a JSON object as a dict (transformers' rule for
    tool-use templates, which vLLM follows), anything else as the text it is."""
    if text[:1] == "{":
        try:
            value = json.loads(text)
        except ValueError:
            return text
        if isinstance(value, dict):
            return value
    return text
