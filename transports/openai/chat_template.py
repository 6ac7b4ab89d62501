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
variables `messages` (role and content; text parts joined by newlines), `add_generation_prompt`
(true), `bos_token`, `eos_token`. jinja2 is imported only when a model has a template (the
`openai` extra: pip install 'kernel-inference-server[openai]').

Without a template, the prompt is one line per message, `<role>: <content>`, and a last line
`assistant:` that the model completes.

Templates are read once per loaded model version, off the event loop, and kept compiled.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from datetime import datetime
from pathlib import Path
from typing import Optional

from kernel.transports.openai.errors import ApiError, bad_request


class _TemplateRaised(Exception):
    """raise_exception() in a template: the message is the client's problem."""


class ChatTemplate:
    __slots__ = ("source", "template", "bos_token", "eos_token", "__weakref__")

    def __init__(self, source: str, text: Optional[str], bos_token: str = "", eos_token: str = "") -> None:
        self.source = source  # where the template came from, for messages
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.template = _compile(text, source) if text else None

    def render(self, messages: list[dict]) -> str:
        if self.template is None:
            return plain_prompt(messages)
        try:
            return self.template.render(messages=messages, add_generation_prompt=True, bos_token=self.bos_token,
                                        eos_token=self.eos_token)
        except _TemplateRaised as exc:
            raise bad_request(f"the model's chat template refused the messages: {exc}", "messages") from None
        except Exception as exc:  # noqa: BLE001 - a template that fails on these messages
            raise bad_request(f"the model's chat template ({self.source}) failed on these messages: "
                              f"{type(exc).__name__}: {exc}", "messages") from None


def plain_prompt(messages: list[dict]) -> str:
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    lines.append("assistant:")
    return "\n".join(lines)


def _compile(text: str, source: str):
    try:
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ApiError(500, f"the model has a chat template ({source}) and rendering it needs jinja2, which is not "
                            "installed: pip install 'kernel-inference-server[openai]'", "server_error") from None

    def raise_exception(message):
        raise _TemplateRaised(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(text)
    except TemplateError as exc:
        raise ApiError(500, f"the model's chat template ({source}) does not compile: {exc}", "server_error") from None


def _token(value) -> str:
    if isinstance(value, dict):  # a serialized AddedToken
        value = value.get("content", "")
    return value if isinstance(value, str) else ""


def load(model) -> ChatTemplate:
    """The model's chat template (file reads: call off the event loop)."""
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
                raise ApiError(500, f"{config} cannot be read: {exc}", "server_error") from None
            if not isinstance(tokens, dict):
                tokens = {}
        bos, eos = _token(tokens.get("bos_token")), _token(tokens.get("eos_token"))
        if jinja.is_file():
            return ChatTemplate(str(jinja), jinja.read_text(encoding="utf-8"), bos, eos)
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
        out.append(entry)
    return out
