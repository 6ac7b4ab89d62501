"""How a completion call's answer is written: chat completions and text completions.

A form turns what a call's choices said (generation.Generation: each choice's ChoiceText, its
text) into OpenAI's objects: the events of a stream as they come (`opening`, `chunk`, `closing`,
`error_event`) and the one JSON answer of a call that does not stream (`answer`). The Responses
API has a form of its own (responses.py). A text chunk, the event sent per token, is built from
bytes kept per call (no dict, no JSON encoder for the envelope): it is the hot path.
"""

from __future__ import annotations

import os
import time
import msgspec

from kernel.transports.openai import calls
from kernel.transports.openai.convention import finish_reason

_json = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"


class ChatForm:
    """/v1/chat/completions. `legacy`: the call sent the older `functions`, so calls are answered as
    `function_call` (the first one) with finish_reason "function_call"."""

    object_name = "chat.completion"

    def __init__(self, model_name: str, include_usage: bool, legacy: bool = False, kind: str = "chat.completion.chunk",
                 id_prefix: str = "chatcmpl-") -> None:
        self.id = id_prefix + os.urandom(12).hex()
        self.created = int(time.time())
        self.model_name = model_name
        self.include_usage = include_usage
        self.legacy = legacy
        self.calls_reason = "function_call" if legacy else "tool_calls"
        self._prefix = (b'data: {"id":"' + self.id.encode() + b'","object":"' + kind.encode() + b'","created":'
                        + b"%d" % self.created + b',"model":' + _json.encode(model_name) + b',"choices":[')
        self._suffix = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"

    def opening(self, gen) -> bytes:
        return b""

    def chunk(self, gen, index: int, text: str, final: bool) -> bytes:
        choice = gen.choices[index]
        reason = finish_reason(choice, gen.max_tokens, self.calls_reason) if final else None
        reason_json = b"null" if reason is None else b'"' + reason.encode() + b'"'
        first = not gen.announced[index]
        if choice.calls is None and choice.logprobs is None:  # the common case: a piece of text
            if first:
                delta = b'"role":"assistant","content":' + _json.encode(text)
            elif text:
                delta = b'"content":' + _json.encode(text)
            else:
                delta = b""  # a last chunk with no text: an empty delta and the finish reason
            return (self._prefix + b'{"index":%d,"delta":{' % index + delta + b'},"logprobs":null,"finish_reason":'
                    + reason_json + b"}" + self._suffix)
        delta: dict = {"role": "assistant"} if first else {}
        if text or first:
            delta["content"] = text or None
        if choice.calls:
            if self.legacy:
                delta["function_call"] = choice.calls[0]["function"]
            else:
                done = len(choice.all_calls) - len(choice.calls)
                delta["tool_calls"] = [dict(call, index=done + i) for i, call in enumerate(choice.calls)]
        body = {"index": index, "delta": delta, "logprobs": calls.chat_logprobs(choice.logprobs),
                "finish_reason": reason}
        return self._prefix + _json.encode(body) + self._suffix

    def closing(self, gen) -> bytes:
        if self.include_usage:
            return self._prefix + b'],"usage":' + _json.encode(gen.usage()) + b"}\n\n" + DONE
        return DONE

    def error_event(self, body: bytes) -> bytes:
        return b"data: " + body + b"\n\n"

    def answer(self, gen) -> dict:
        choices = []
        for index, parts in enumerate(gen.texts):
            choice = gen.choices[index]
            text = "".join(parts)
            message: dict = {"role": "assistant", "content": text}
            if choice.all_calls:
                if not text:
                    message["content"] = None
                if self.legacy:
                    message["function_call"] = choice.all_calls[0]["function"]
                else:
                    message["tool_calls"] = choice.all_calls
            choices.append({"index": index, "message": message, "logprobs": calls.chat_logprobs(choice.all_logprobs),
                            "finish_reason": finish_reason(choice, gen.max_tokens, self.calls_reason)})
        return {"id": self.id, "object": self.object_name, "created": self.created, "model": self.model_name,
                "choices": choices, "usage": gen.usage(), "system_fingerprint": None}


class CompletionForm(ChatForm):
    """/v1/completions."""

    object_name = "text_completion"

    def __init__(self, model_name: str, include_usage: bool) -> None:
        super().__init__(model_name, include_usage, False, "text_completion", "cmpl-")
        self._offsets: dict[int, int] = {}

    def chunk(self, gen, index: int, text: str, final: bool) -> bytes:
        choice = gen.choices[index]
        reason = finish_reason(choice, gen.max_tokens) if final else None
        if choice.logprobs is None:
            reason_json = b"null" if reason is None else b'"' + reason.encode() + b'"'
            return (self._prefix + b'{"index":%d,"text":' % index + _json.encode(text) + b',"logprobs":null,'
                    b'"finish_reason":' + reason_json + b"}" + self._suffix)
        offset = self._offsets.get(index, 0)
        self._offsets[index] = offset + len(text)
        body = {"index": index, "text": text, "logprobs": calls.completion_logprobs(choice.logprobs, offset),
                "finish_reason": reason}
        return self._prefix + _json.encode(body) + self._suffix

    def answer(self, gen) -> dict:
        choices = []
        for index, parts in enumerate(gen.texts):
            choice = gen.choices[index]
            entries = choice.all_logprobs
            choices.append({"index": index, "text": "".join(parts),
                            "logprobs": None if entries is None else calls.completion_logprobs(entries),
                            "finish_reason": finish_reason(choice, gen.max_tokens)})
        return {"id": self.id, "object": self.object_name, "created": self.created, "model": self.model_name,
                "choices": choices, "usage": gen.usage(), "system_fingerprint": None}


def answer_bytes(form, gen) -> bytes:
    return _json.encode(form.answer(gen))

