"""Which models the OpenAI routes can call, and how a call becomes their tensors.

Text generation follows the tensor convention of Triton's vLLM backend, so the same model.py
answers Triton's generate endpoints and these routes:

    inputs   text_input (BYTES, required)          the prompt
             stream (BOOL)                          true: send each piece of text as it comes
             sampling_parameters (BYTES)            JSON object: max_tokens, temperature, stop, seed...
             exclude_input_in_output (BOOL)         true: the answer does not repeat the prompt
             return_num_input_tokens (BOOL)         ask for num_input_tokens
             return_num_output_tokens (BOOL)        ask for num_output_tokens
             return_finish_reason (BOOL)            ask for finish_reason
    outputs  text_output (BYTES, required)          the text of this response: a delta when streaming
             num_input_tokens (UINT32)              prompt tokens (usage.prompt_tokens)
             num_output_tokens (UINT32)             tokens of this response (summed: usage.completion_tokens)
             finish_reason (BYTES)                  "stop", "length", ...
             tool_calls, logprobs (BYTES)           see features.py and calls.py

Only `text_input` and `text_output` are required; every other input is sent only when the model
declares it, and a model without `sampling_parameters` gets the sampling fields as request
parameters instead (scalars as they are, lists and objects as the JSON text the client sent),
which is where a PyTriton-style callable reads them (`request.parameters`). The choices of a call
(n, several prompts) share one prompt's bytes and one copy of the sampling fields. A decoupled model streams; every
response's text is a delta (the vLLM backend's behaviour with stream=true; with stream=false it
sends its whole text once, which reads the same). A model that declares neither token output
gives no `usage`.

Embeddings: a model that is not decoupled, takes `text_input` (BYTES) and answers a floating-point
vector in `embedding` (or in its only output when that is FP16/FP32/FP64).
"""

from __future__ import annotations

import codecs
import struct
import weakref
from typing import Any, Optional

import msgspec
import numpy as np

from kernel.core.datatypes import deserialize_bytes
from kernel.core.request import InferRequest, InferResponse, InferTensor
from kernel.transports.openai import calls, features
from kernel.transports.openai.errors import ApiError

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
_OPTIONAL_BOOL_INPUTS = ("stream", "exclude_input_in_output", "return_num_input_tokens",
                         "return_num_output_tokens", "return_finish_reason")
_FLOATS = ("FP16", "FP32", "FP64")
_TRUE = b"\x01"
_FALSE = b"\x00"
_pack_len = struct.Struct("<I").pack
_unpack_len = struct.Struct("<I").unpack_from
_utf8 = codecs.utf_8_decode  # (text, bytes used): bytes of a character cut at the end are left unused
_json = msgspec.json.Encoder()
_values = msgspec.json.Decoder()


def _shape(model, dims) -> tuple:
    """One element in the model's shape for an input: -1 dims become 1, a batch dimension of 1."""
    shape = tuple(1 if d == -1 else d for d in dims)
    return (1, *shape) if model.max_batch_size > 0 else shape


class TextModel:
    """A model that fits the text-generation convention (see the module docstring); built once per
    model version and kept while the version is loaded."""

    __slots__ = ("name", "version", "decoupled", "problem", "shapes", "has_sampling", "has_counts", "has_finish",
                 "excludes_input", "supports", "unsupported", "__weakref__")

    def __init__(self, model) -> None:
        self.name = model.name
        self.version = model.version_str
        self.decoupled = model.decoupled
        self.problem = _text_problem(model)
        self.shapes = {}
        inputs = model.inputs
        for name in (TEXT_INPUT, "sampling_parameters", *_OPTIONAL_BOOL_INPUTS):
            spec = inputs.get(name)
            if spec is not None:
                self.shapes[name] = _shape(model, spec.dims)
        outputs = model.outputs
        self.has_sampling = "sampling_parameters" in inputs
        self.has_counts = "num_input_tokens" in outputs and "num_output_tokens" in outputs
        self.has_finish = "finish_reason" in outputs
        self.excludes_input = "exclude_input_in_output" in inputs
        self.supports, self.unsupported = features.declared(model)

    # ---- one call's inputs: made once, shared by its choices ---------------------------------

    def prompt_input(self, prompt: str) -> bytes:
        """The text_input tensor's bytes for a prompt (every choice of that prompt shares them)."""
        data = prompt.encode("utf-8")
        return _pack_len(len(data)) + data

    def sampling_input(self, sampling: dict):
        """The sampling fields as the model takes them: the sampling_parameters tensor's bytes, or
        (a model without that input) the request parameters, scalars as they are and lists and
        objects as JSON text. `sampling` maps field names to JSON text (msgspec.Raw, as sent) or
        to values."""
        if self.has_sampling:
            text = _json.encode(sampling)
            return _pack_len(len(text)) + text
        return {key: _parameter(value) for key, value in sampling.items()}

    def seeded_input(self, sampling: dict, shared, seed: int):
        """sampling_input with another seed (a choice of a seeded call with n > 1); `shared` is
        sampling_input(sampling): a model without sampling_parameters reuses its converted values."""
        if self.has_sampling:
            text = _json.encode(dict(sampling, seed=seed))
            return _pack_len(len(text)) + text
        return dict(shared, seed=seed)

    def build(self, request_id: str, prompt: bytes, stream: bool, sampling, echo: bool) -> InferRequest:
        """The core request for one choice: `prompt` from prompt_input, `sampling` from sampling_input
        (the bytes and the dict are shared by the call's choices, never copied per choice)."""
        shapes = self.shapes
        inputs = [InferTensor(TEXT_INPUT, "BYTES", shapes[TEXT_INPUT], raw=prompt)]
        parameters: dict[str, Any]
        if self.has_sampling:
            inputs.append(InferTensor("sampling_parameters", "BYTES", shapes["sampling_parameters"], raw=sampling))
            parameters = {}
        else:
            parameters = sampling
        for name, value in (("stream", stream), ("exclude_input_in_output", not echo),
                            ("return_num_input_tokens", True), ("return_num_output_tokens", True),
                            ("return_finish_reason", True)):
            shape = shapes.get(name)
            if shape is not None:
                inputs.append(InferTensor(name, "BOOL", shape, raw=_TRUE if value else _FALSE))
        return InferRequest(self.name, self.version, request_id, inputs, None, parameters)


def _parameter(value):
    """A sampling field as a request parameter: a scalar as it is, a list or an object as JSON text."""
    if isinstance(value, msgspec.Raw):
        text = bytes(value)
        if text[:1] in (b"[", b"{"):
            return text.decode("utf-8")
        value = _values.decode(text)
    return value if isinstance(value, (str, int, float, bool)) else _json.encode(value).decode()


def _text_problem(model) -> Optional[str]:
    """Why the model cannot serve text generation, or None."""
    missing = []
    spec = model.inputs.get(TEXT_INPUT)
    if spec is None or spec.datatype != "BYTES":
        missing.append(f"a BYTES input '{TEXT_INPUT}'")
    out = model.outputs.get(TEXT_OUTPUT)
    if out is None or out.datatype != "BYTES":
        missing.append(f"a BYTES output '{TEXT_OUTPUT}'")
    known = {TEXT_INPUT, "sampling_parameters", *_OPTIONAL_BOOL_INPUTS}
    others = [n for n in model.required_inputs if n not in known]
    if others:
        missing.append("no other required inputs (it requires " + ", ".join(f"'{n}'" for n in others) + ")")
    if not missing:
        return None
    return (f"model '{model.name}' cannot serve text generation: it needs " + " and ".join(missing)
            + " (the tensor convention of Triton's vLLM backend)")


class ChoiceText:
    """What one choice's responses said: its text (decoded across response boundaries, as a UTF-8
    character may be split between two tokens), token counts, pieces, finish reason, tool calls
    and (when asked) log probabilities. `calls` and `logprobs` hold what the last response added."""

    __slots__ = ("pending", "prompt_tokens", "completion_tokens", "counted", "pieces", "finish_reason", "model",
                 "calls", "all_calls", "logprobs", "all_logprobs")

    def __init__(self, model: str = "", want_logprobs: bool = False) -> None:
        # The first bytes of a character split between two responses, until the next one completes
        # it. What codecs' incremental decoder keeps, without its Python layer per token (it was
        # ~10% of the front's time at concurrency 64).
        self.pending = b""
        self.prompt_tokens: Optional[int] = None
        self.completion_tokens = 0
        self.counted = False  # the model reports num_output_tokens
        self.pieces = 0  # responses that carried text: the token count of a model that reports none
        self.finish_reason: Optional[str] = None
        self.model = model
        self.calls: Optional[list] = None
        self.all_calls: Optional[list] = None
        self.logprobs: Optional[list] = None
        # None: not asked for (a model's logprobs output is then not read)
        self.all_logprobs: Optional[list] = [] if want_logprobs else None

    def read(self, response: InferResponse, final: bool) -> str:
        """The text this response adds; counts, finish reason, calls and log probabilities noted
        (ApiError for a tool_calls or logprobs output that cannot be read)."""
        text = ""
        if self.calls is not None:
            self.calls = None
        if self.logprobs is not None:
            self.logprobs = None
        for tensor in response.outputs:
            name = tensor.name
            if name == TEXT_OUTPUT:
                data = _text_bytes(tensor)
                if self.pending:
                    data = self.pending + bytes(data)
                text, used = _utf8(data, "replace", final)
                self.pending = bytes(data[used:]) if used < len(data) else b""
                if text:
                    self.pieces += 1
            elif name == "num_output_tokens":
                self.completion_tokens += _first_int(tensor)
                self.counted = True
            elif name == "num_input_tokens":
                if self.prompt_tokens is None:
                    self.prompt_tokens = _first_int(tensor)
            elif name == "finish_reason":
                values = _strings(tensor)
                if values and values[0] and values[0] not in (b"None", b"null"):  # vLLM: "None" until the end
                    self.finish_reason = values[0].decode("utf-8", "replace")
            elif name == "tool_calls":
                found = calls.tool_calls(_strings(tensor), self.model)
                if found:
                    known = self.all_calls or []
                    if len(known) + len(found) > calls.MAX_CALLS:
                        raise ApiError(500, f"model '{self.model}' made more than {calls.MAX_CALLS} tool calls in one "
                                            "choice", "server_error", None, "model_output")
                    self.calls = found
                    self.all_calls = known + found
            elif name == "logprobs" and self.all_logprobs is not None:
                self.logprobs = calls.logprobs(_strings(tensor), self.model)
                self.all_logprobs += self.logprobs
        if final and self.pending:  # a final response without text: what was left is replaced
            text, self.pending = text + _utf8(self.pending, "replace", True)[0], b""
        return text


def _strings(tensor: InferTensor) -> list[bytes]:
    if tensor.datatype != "BYTES":
        return [str(v).encode() for v in tensor.as_numpy().reshape(-1)]
    try:
        return deserialize_bytes(tensor.raw)
    except ValueError:
        return []


def _text_bytes(tensor: InferTensor):
    """The bytes of a text output: its one element, read in place (the common case), else all
    elements joined."""
    if tensor.datatype == "BYTES":
        raw = tensor.raw
        if len(raw) >= 4 and _unpack_len(raw, 0)[0] + 4 == len(raw):
            # A token's few bytes: a slice costs less than a view; a whole answer is not copied.
            return raw[4:] if len(raw) <= 4096 and type(raw) is bytes else memoryview(raw)[4:]
    return b"".join(_strings(tensor))


_INTS = {name: struct.Struct("<" + code) for name, code in (
    ("UINT8", "B"), ("INT8", "b"), ("UINT16", "H"), ("INT16", "h"), ("UINT32", "I"), ("INT32", "i"),
    ("UINT64", "Q"), ("INT64", "q"))}


def _first_int(tensor: InferTensor) -> int:
    """A count output's first element (read from its bytes for integer types: no numpy per token)."""
    fmt = _INTS.get(tensor.datatype)
    if fmt is not None:
        raw = tensor.raw
        if len(raw) >= fmt.size:
            return fmt.unpack_from(raw, 0)[0]
        return 0
    array = tensor.as_numpy().reshape(-1)
    return int(array[0]) if array.size else 0


def finish_reason(choice: ChoiceText, limit: Optional[int], calls_reason: str = "tool_calls") -> str:
    """OpenAI's finish_reason: "length" when the model stopped at max_tokens (its own reason, else
    its token count, else the pieces of text it sent, reaching max_tokens); `calls_reason`
    ("tool_calls", or "function_call" for the older functions) when it made calls; else the model's
    reason when OpenAI has it, else "stop"."""
    reason = choice.finish_reason
    if reason is None and limit is not None:
        produced = choice.completion_tokens if choice.counted else choice.pieces
        if produced >= limit:
            reason = "length"
    if choice.all_calls and reason != "length":
        return calls_reason
    if reason in ("stop", "length", "content_filter", "tool_calls"):
        return reason
    return "stop"


class EmbeddingModel:
    __slots__ = ("name", "version", "problem", "shape", "output", "has_counts", "__weakref__")

    def __init__(self, model) -> None:
        self.name = model.name
        self.version = model.version_str
        self.problem = None
        self.output = None
        spec = model.inputs.get(TEXT_INPUT)
        numeric = [o for o in model.outputs.values() if o.datatype in _FLOATS]
        if "embedding" in model.outputs and model.outputs["embedding"].datatype in _FLOATS:
            self.output = "embedding"
        elif len(model.outputs) == 1 and numeric:
            self.output = numeric[0].name
        missing = []
        if spec is None or spec.datatype != "BYTES":
            missing.append(f"a BYTES input '{TEXT_INPUT}'")
        if self.output is None:
            missing.append("a floating-point output 'embedding' (or a single floating-point output)")
        others = [n for n in model.required_inputs if n != TEXT_INPUT]
        if others:
            missing.append("no other required inputs (it requires " + ", ".join(f"'{n}'" for n in others) + ")")
        if missing:
            self.problem = f"model '{model.name}' cannot serve embeddings: it needs " + " and ".join(missing)
        elif model.decoupled:
            self.problem = f"model '{model.name}' is decoupled; embeddings need a model that answers once"
        self.shape = _shape(model, spec.dims) if spec is not None else (1,)
        self.has_counts = "num_input_tokens" in model.outputs

    def build(self, request_id: str, text: bytes) -> InferRequest:
        tensor = InferTensor(TEXT_INPUT, "BYTES", self.shape, raw=_pack_len(len(text)) + text)
        return InferRequest(self.name, self.version, request_id, [tensor])

    def vector(self, response: InferResponse) -> np.ndarray:
        tensor = response.output(self.output)
        if tensor is None:
            raise ApiError(500, f"model '{self.name}' answered without its output '{self.output}'", "server_error")
        return np.asarray(tensor.as_numpy(), dtype=np.float32).reshape(-1)

    def tokens(self, response: InferResponse) -> int:
        tensor = response.output("num_input_tokens") if self.has_counts else None
        return _first_int(tensor) if tensor is not None else 0


# One description per loaded model version, dropped with it.
_text: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_embedding: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def serves_openai(model) -> bool:
    """Whether the OpenAI routes can call the model: it follows the text or the embedding convention."""
    found = _text.get(model)
    if found is None:
        found = _text[model] = TextModel(model)
    if not found.problem:
        return True
    found = _embedding.get(model)
    if found is None:
        found = _embedding[model] = EmbeddingModel(model)
    return not found.problem


def text_model(model) -> TextModel:
    found = _text.get(model)
    if found is None:
        found = _text[model] = TextModel(model)
    if found.problem:
        raise ApiError(400, found.problem, param="model", code="model_not_supported")
    return found


def embedding_model(model) -> EmbeddingModel:
    found = _embedding.get(model)
    if found is None:
        found = _embedding[model] = EmbeddingModel(model)
    if found.problem:
        raise ApiError(400, found.problem, param="model", code="model_not_supported")
    return found
