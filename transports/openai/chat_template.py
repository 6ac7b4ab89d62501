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
(true), `bos_token`, `eos_token`. It renders in a renderer process, with a time and a size limit
(template_pool.py, template_worker.py); jinja2 is needed there only when a model has a template
(the `openai` extra: pip install 'kernel-inference-server[openai]').

Without a template, the prompt is one line per message, `<role>: <content>`, and a last line
`assistant:` that the model completes.

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

    __slots__ = ("source", "text", "bos_token", "eos_token", "__weakref__")

    def __init__(self, source: str, text: Optional[str], bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.text = text or None
        self.bos_token = bos_token
        self.eos_token = eos_token


def plain_prompt(messages: list[dict]) -> str:
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    lines.append("assistant:")
    return "\n".join(lines)


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
        out.append(entry)
    return out
