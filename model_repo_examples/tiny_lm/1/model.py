"""tiny_lm: a word-level text generator with no weights, for a first run of the OpenAI API.

It follows the tensor convention of Triton's vLLM backend (see config.pbtxt): the prompt in
`text_input`, the sampling in `sampling_parameters` (a JSON object), `stream` for one response per
word, `exclude_input_in_output`, and on request `num_input_tokens`, `num_output_tokens` and
`finish_reason`. So the same folder answers Triton's generate_stream endpoint and
`client.chat.completions.create(..., stream=True)` against `kernel serve --openai-port 9000`.

The "language model" is a fixed table of next-word scores over ~130 words (made from a fixed
seed at start-up), sampled the way an LLM is: temperature (0: always the best word), top_p,
presence and frequency penalties, `seed` for the same answer to the same request, `stop`
strings, `max_tokens` (16 when not given, as vLLM), and an end-of-text word that ends the answer
with finish_reason "stop" ("length" when max_tokens ran out; vLLM's `ignore_eos` leaves it out). A token is a word. It is not meant to
say anything sensible: it streams like one, at `token_delay_ms` per word, and stops generating as
soon as the request is cancelled (a client that went away).

It also does what its config declares in `openai_supports` (Kernel's OpenAI API delivers the
fields in `sampling_parameters`), deterministically, so each can be seen end to end:

* `tools`: it calls one tool, in its `tool_calls` output (finish_reason "tool_calls"): the one
  `tool_choice` names, else (`auto`, `required`) the first tool, unless `auto` and the prompt
  already holds a tool's result after the last user message (then it answers in words).
  Arguments are made from the tool's JSON schema (`_value`); `tool_choice: "none"` answers in words.
* `response_format`: `json_object` answers `{"answer": "<words>"}`; `json_schema` an object that
  fits the schema. The JSON is streamed a piece (a token) at a time and cut at max_tokens.
* `logprobs` (chat: true with `top_logprobs`; completions: a count): each token's log
  probability under the table, and the most likely alternatives, in its `logprobs` output.

And it is its own tokenizer (`tokenizer_model` names it; Kernel's /tokenize and /detokenize): a
request with the input `text` answers its words' ids in `token_ids` (a word's place in the table
plus one, 0 for a word it does not know), one with `token_ids` answers their `text`.
"""

import asyncio
import json
import math
import re
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

WORDS = (
    "the a one this that my your our their every some no all of in on at to from with for by about over "
    "under after before between into through cat dog bird fish river mountain city garden window door "
    "book letter song story dream idea question answer light shadow morning evening night day year time "
    "server model token stream request response kernel python network memory queue signal message "
    "runs sees finds makes takes gives keeps brings sends reads writes learns waits walks sings builds "
    "opens closes carries follows remembers answers quietly slowly quickly softly always never often "
    "again together alone here there today tomorrow old new small large bright dark warm cold quiet "
    "happy early late green blue red golden and but or so because while when if then ,"
).split()
END = len(WORDS)  # the end-of-text word: ends the answer with finish_reason "stop"
PERIOD = len(WORDS) + 1
VOCAB = WORDS + ["<end>", "."]
DEFAULT_MAX_TOKENS = 16


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.delay = float(params.get("token_delay_ms", "0")) / 1000.0
        self.context = int(params.get("context_length", "4096"))
        table_rng = np.random.default_rng(20240521)
        self.scores = table_rng.normal(0.0, 2.0, size=(len(VOCAB), len(VOCAB)))
        self.scores[:, END] -= 3.0  # the answer rarely ends at once...
        self.scores[PERIOD, END] += 5.0  # ...but often after a full stop
        self.scores[:, PERIOD] -= 1.0
        self.index = {w: i for i, w in enumerate(VOCAB)}

    async def execute(self, requests):
        await asyncio.gather(*(self._generate(r) for r in requests))
        return None

    # ---- one request -------------------------------------------------------------------------

    async def _generate(self, request):
        sender = request.get_response_sender()
        if pb_utils.get_input_tensor_by_name(request, "text_input") is None:
            self._tokenizer(request, sender)
            return
        try:
            job = self._job(request)
        except (ValueError, TypeError) as exc:
            error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        structured = self._structured(job) if job["tools"] or job["response_format"] else None
        if structured is not None:
            await self._send_pieces(request, sender, job, *structured)
            return
        rng = np.random.default_rng(job["seed"])
        words = job["prompt"].split()
        previous = self.index.get(words[-1], zlib.crc32(words[-1].encode()) % len(WORDS)) if words else PERIOD
        counts = np.zeros(len(VOCAB))
        text, reason, produced = "", "length", 0
        for step in range(job["max_tokens"]):
            if request.is_cancelled():
                pb_utils.Logger.log_info(f"tiny_lm: request '{request.request_id()}' cancelled after {produced} tokens")
                error = pb_utils.TritonError("Request was cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            await asyncio.sleep(self.delay)
            word = self._next(previous, counts, job, rng)
            if word == END:
                reason = "stop"
                break
            if job["logprobs"] is not None:
                job["logprobs"].append(self._logprob(previous, word, job["top_logprobs"]))
            counts[word] += 1
            previous = word
            piece = VOCAB[word] if word == PERIOD or VOCAB[word] == "," else " " + VOCAB[word]
            produced += 1
            cut = _stop_at(text, piece, job["stop"])
            last = cut is not None or step == job["max_tokens"] - 1
            if cut is not None:
                piece, reason = piece[:cut], "stop"
            text += piece
            if job["stream"]:
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0
                sender.send(self._response(job, piece, 1, reason if last else None, _taken(job)), flags=flags)
                if last:
                    return
            elif last:
                break
        if job["stream"]:  # ended by the end-of-text word: a last response with no text
            sender.send(self._response(job, "", 0, reason), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        whole = text if job["exclude_input"] else job["prompt"] + text
        sender.send(self._response(job, whole, produced, reason, _taken(job)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _next(self, previous, counts, job, rng):
        logits = self.scores[previous]
        if job["presence_penalty"] or job["frequency_penalty"]:
            logits = logits - job["presence_penalty"] * (counts > 0) - job["frequency_penalty"] * counts
        if job["ignore_eos"]:
            logits = logits.copy()
            logits[END] = -np.inf
        if job["temperature"] == 0:
            return int(np.argmax(logits))
        logits = logits / job["temperature"]
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        if job["top_p"] < 1.0:
            order = np.argsort(-probs)
            keep = np.cumsum(probs[order]) - probs[order] < job["top_p"]
            mask = np.zeros_like(probs)
            mask[order[keep]] = 1.0
            probs = probs * mask
            probs /= probs.sum()
        # What rng.choice(len(VOCAB), p=probs) draws (the same one number from rng, the same word),
        # without its checks of p: those cost ~50 us a word, more than the rest of a token together.
        cdf = probs.cumsum()
        cdf /= cdf[-1]
        return int(cdf.searchsorted(rng.random(), side="right"))

    def _tokenizer(self, request, sender):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        ids = pb_utils.get_input_tensor_by_name(request, "token_ids")
        if ids is not None:
            words = [VOCAB[i - 1] if 0 < i <= len(VOCAB) else "<unk>" for i in ids.as_numpy().reshape(-1).tolist()]
            out = pb_utils.Tensor("text", np.array([" ".join(words).encode()], dtype=np.object_))
        else:
            text = _scalar(request, "text", b"")
            text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
            ids = [self.index[w] + 1 if w in self.index else 0 for w in text.split()]
            out = pb_utils.Tensor("token_ids", np.array(ids, dtype=np.int64))
        sender.send(pb_utils.InferenceResponse(output_tensors=[out]), flags=final)

    def _logprob(self, previous, word, top):
        """The chosen word's log probability under the table (temperature 1), and the `top` likeliest."""
        logits = self.scores[previous]
        logp = logits - logits.max()
        logp = logp - math.log(np.exp(logp).sum())
        entry = {"token": _piece(word), "logprob": float(logp[word])}
        if top:
            best = np.argsort(-logp)[:top]
            entry["top_logprobs"] = [{"token": _piece(int(w)), "logprob": float(logp[w])} for w in best]
        return entry

    # ---- tool calls and JSON answers ---------------------------------------------------------

    def _structured(self, job):
        """(pieces, reason, tool calls) of an answer that is a tool call or JSON, or None (words).
        The same for the same prompt, with or without a seed."""
        rng = np.random.default_rng(job["seed"] or zlib.crc32(job["prompt"].encode()))
        tools, choice = job["tools"], job["tool_choice"]
        if tools and choice != "none":
            name = None
            if isinstance(choice, dict):
                name = (choice.get("function") or {}).get("name")
            elif choice == "required" or not _answered(job["prompt"]):
                name = tools[0]["function"]["name"]
            if name is not None:
                tool = next((t for t in tools if t["function"]["name"] == name), tools[0])
                arguments = _value(tool["function"].get("parameters") or {"type": "object"}, self._words(rng), 0)
                call = {"id": f"call_{zlib.crc32(job['prompt'].encode()):08x}", "name": name,
                        "arguments": json.dumps(arguments)}
                return [""], "tool_calls", [call]
        fmt = job["response_format"]
        if fmt and fmt.get("type") in ("json_object", "json_schema"):
            if fmt["type"] == "json_object":
                value = {"answer": " ".join(self._words(rng)(6))}
            else:
                schema = (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
                value = _value(schema, self._words(rng), 0)
            pieces = re.findall(r"\S+\s*", json.dumps(value)) or [json.dumps(value)]
            if len(pieces) > job["max_tokens"]:
                return pieces[:job["max_tokens"]], "length", None
            return pieces, "stop", None
        return None

    def _words(self, rng):
        """A function giving `k` words of the table, sampled greedily from a word `rng` picks."""
        def words(k):
            word, out = int(rng.integers(len(WORDS))), []
            for _ in range(k):
                out.append(WORDS[word])
                row = self.scores[word][:len(WORDS)]
                word = int(np.argmax(row - 10.0 * np.isin(np.arange(len(WORDS)), [self.index[w] for w in out])))
            return out
        return words

    async def _send_pieces(self, request, sender, job, pieces, reason, calls):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if job["logprobs"] is not None:
            job["logprobs"] = [{"token": p, "logprob": 0.0, **({"top_logprobs": [{"token": p, "logprob": 0.0}]}
                                                                 if job["top_logprobs"] else {})} for p in pieces if p]
        if not job["stream"]:
            text = "".join(pieces)
            whole = text if job["exclude_input"] else job["prompt"] + text
            sender.send(self._response(job, whole, sum(1 for p in pieces if p), reason, _taken(job), calls),
                        flags=final)
            return
        entries = job["logprobs"]
        for i, piece in enumerate(pieces):
            if request.is_cancelled():
                error = pb_utils.TritonError("Request was cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                return
            await asyncio.sleep(self.delay)
            last = i == len(pieces) - 1
            taken = [entries[i]] if entries is not None and piece else None
            sender.send(self._response(job, piece, 1 if piece else 0, reason if last else None, taken,
                                       calls if last else None), flags=final if last else 0)

    def _response(self, job, text, produced, reason, logprobs=None, calls=None):
        tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
        if calls:
            tensors.append(pb_utils.Tensor("tool_calls", np.array([json.dumps(calls).encode()], dtype=np.object_)))
        if logprobs:
            tensors.append(pb_utils.Tensor("logprobs", np.array([json.dumps(logprobs).encode()], dtype=np.object_)))
        if job["return_num_input_tokens"]:
            tensors.append(pb_utils.Tensor("num_input_tokens", np.array([job["prompt_tokens"]], dtype=np.uint32)))
        if job["return_num_output_tokens"]:
            tensors.append(pb_utils.Tensor("num_output_tokens", np.array([produced], dtype=np.uint32)))
        if job["return_finish_reason"] and reason is not None:
            tensors.append(pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    # ---- the request's inputs ----------------------------------------------------------------------

    def _job(self, request):
        prompt = _scalar(request, "text_input")
        prompt = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else str(prompt)
        raw = _scalar(request, "sampling_parameters")
        params = json.loads(raw) if raw else {}
        if not isinstance(params, dict):
            raise ValueError("sampling_parameters must be a JSON object")
        max_tokens = params.get("max_tokens", DEFAULT_MAX_TOKENS)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        prompt_tokens = len(prompt.split())
        if prompt_tokens + max_tokens > self.context:
            raise ValueError(f"This model's maximum context length is {self.context} tokens; the request asks for "
                             f"{prompt_tokens + max_tokens} ({prompt_tokens} in the prompt, {max_tokens} to generate)")
        stop = params.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ValueError("stop must be a string or a list of strings")
        seed = params.get("seed")
        if seed is not None:
            seed = [int(seed) & 0xFFFFFFFFFFFFFFFF, zlib.crc32(prompt.encode("utf-8"))]
        logprobs = params.get("logprobs")
        if isinstance(logprobs, bool) or logprobs is None:  # chat: true and top_logprobs; completions: a count
            top = int(params.get("top_logprobs") or 0) if logprobs else 0
            logprobs = [] if logprobs else None
        else:
            top, logprobs = int(logprobs), []
        tools = params.get("tools") or []
        if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                                  for t in tools):
            raise ValueError("tools must be a list of {\"type\": \"function\", \"function\": {...}}")
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0))
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
        return {
            "prompt": prompt, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens, "stop": [s for s in stop if s],
            "seed": seed, "temperature": temperature, "top_p": top_p,
            "presence_penalty": float(params.get("presence_penalty", 0.0)),
            "frequency_penalty": float(params.get("frequency_penalty", 0.0)),
            "ignore_eos": bool(params.get("ignore_eos", False)),
            "stream": bool(_scalar(request, "stream", False)),
            "exclude_input": bool(_scalar(request, "exclude_input_in_output", False)),
            "return_num_input_tokens": bool(_scalar(request, "return_num_input_tokens", False)),
            "return_num_output_tokens": bool(_scalar(request, "return_num_output_tokens", False)),
            "return_finish_reason": bool(_scalar(request, "return_finish_reason", False)),
            "logprobs": logprobs, "top_logprobs": min(top, len(VOCAB)), "tools": tools,
            "tool_choice": params.get("tool_choice", "auto"), "response_format": params.get("response_format"),
        }


def _piece(word):
    return VOCAB[word] if word == PERIOD or VOCAB[word] == "," else " " + VOCAB[word]


def _taken(job):
    """The log probabilities gathered since the last response (None: not asked for)."""
    entries = job["logprobs"]
    if not entries:
        return None
    job["logprobs"] = []
    return entries


def _answered(prompt):
    """Whether a tool's result follows the last user message (the plain template: `tool: ...` lines)."""
    lines = prompt.splitlines()
    users = [i for i, line in enumerate(lines) if line.startswith("user:")]
    return any(line.startswith("tool:") for line in lines[(users[-1] if users else 0):])


def _value(schema, words, depth, root=None):
    """A value that fits a JSON schema (the parts tools and structured outputs use), made of `words`."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 8:
        return None
    if isinstance(schema.get("$ref"), str):
        defs = root.get("$defs") or root.get("definitions") or {}
        return _value(defs.get(schema["$ref"].rsplit("/", 1)[-1], {}), words, depth + 1, root)
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _value(schema[key][0], words, depth + 1, root)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {k: _value(v, words, depth + 1, root) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [_value(schema.get("items") or {}, words, depth + 1, root)]
    if kind == "integer":
        return 1
    if kind == "number":
        return 1.5
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return " ".join(words(2))


def _scalar(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    values = tensor.as_numpy().reshape(-1)
    return values[0] if values.size else default


def _stop_at(text, piece, stops):
    """Where in `piece` a stop string ends the answer (the stop string itself left out), or None."""
    if not stops:
        return None
    joined = text + piece
    best = None
    for s in stops:
        at = joined.find(s, max(0, len(text) - len(s) + 1))
        if at != -1 and (best is None or at < best):
            best = at
    return None if best is None else max(0, best - len(text))
