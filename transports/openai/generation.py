"""One completion call (chat or text): its choices' core requests, and their responses turned into
OpenAI objects, either one JSON answer or server-sent events ending in `data: [DONE]`.

Each choice (n per prompt) is a core request of its own. Responses are turned into bytes as they
arrive (`on_response`, on the event loop): what a stream holds for its client is encoded text,
never a model's tensors, and it is bounded:

- The status is decided by the first response: an error before any text is the call's error
  answer (a 400 for a prompt the model refuses); after that an error is an event
  `data: {"error": {...}}` and the stream ends.
- Bytes not yet written wait in `pending`. A client that reads slower than the model writes lets
  them pile up; past MAX_PENDING_BYTES the call's requests are cancelled (the model sees
  is_cancelled()) and the stream ends with an error event once the client reads on. The stream is
  a holder of the server's account of held bytes (kernel.core.holding) whenever it holds any (what
  waits here; what waits in its connection's write buffer the connection counts), so a client
  that stops reading is cut after --client-stall-timeout-secs, and all streams together stay
  within --max-held-output-bytes.
- A non-streamed answer's text is kept until the last choice ends; past --http-max-json-output-size
  the call's requests are cancelled and the client gets a 400 naming that limit. While it grows
  it is in the same account (it waits for this client), so it counts against
  --max-held-output-bytes; cut there, the call answers 503 naming the reason. Once written, what
  the client has not read waits in its connection, which the listener counts (http_limits).
- A client that goes away cancels every request of the call.

The writer sends everything that arrived since its last write in one body message: a client
that is slower than the model gets fewer, larger writes, never more memory.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

import msgspec

from kernel.core.errors import KernelError
from kernel.core.request import InferResponse
from kernel.transports.asgi import start_stream
from kernel.transports.openai.convention import ChoiceText, TextModel
from kernel.transports.openai.schema import offset_seed
from kernel.transports.reset import reset
from kernel.transports.openai.errors import (
    SERVER_ERROR, ApiError, answer_too_large, error_body, from_kernel, send_error,
)

# A choice whose inputs take more than this is submitted in a loop turn of its own (see submit).
YIELD_BYTES = 64 * 1024
MAX_PENDING_BYTES = 1 << 20  # encoded events one stream may hold for a client that reads too slowly
_WATCH_BYTES = 64 * 1024  # pending bytes past which a stream joins the held-bytes account before any write
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_json = msgspec.json.Encoder()
log = logging.getLogger("kernel.openai")


class Generation:
    """The choices of one /v1/chat/completions or /v1/completions call."""

    def __init__(self, server, model_name: str, text_model: TextModel, form, prompts: list[str], n: int,
                 max_tokens: Optional[int], echo: bool, answer_limit: int = 64 * 1024 * 1024,
                 want_logprobs: bool = False) -> None:
        """`form`: how the answer is written (forms.ChatForm, forms.CompletionForm, responses.ResponsesForm)."""
        self.server = server
        self.answer_limit = answer_limit  # the most bytes a non-streamed answer may take (--http-max-json-output-size)
        self.text_size = 0  # non-streaming: characters of text held in `texts` (a lower bound of their bytes)
        self.form = form
        self.text_model = text_model
        self.id = form.id
        self.model_name = model_name
        self.prompts = prompts
        self.n = n
        self.max_tokens = max_tokens
        # A model without the exclude_input_in_output input answers without the prompt: echo puts
        # the prompt in front of its answer here.
        self.echo = echo
        self.echo_here = echo and not text_model.excludes_input
        count = len(prompts) * n
        self.choices = [ChoiceText(model_name, want_logprobs) for _ in range(count)]
        self.texts: list[list[str]] = [[] for _ in range(count)]  # non-streaming: the text of each choice
        self.announced = [False] * count  # streaming: the choice's first chunk went out (chat: with its role)
        self.requests: list = []
        self._inputs: list = []  # prepare(): each prompt's text_input bytes
        self._sampling: list = []  # prepare(): the sampling input (one shared; n with a seed and n > 1)
        self._sampling_size = 0
        self.stream = False
        self.remaining = count
        self.committed = False  # a response with data came: the status is 200
        self.error: Optional[ApiError] = None  # the call's error answer (before anything was committed)
        self.finished = False  # nothing more will be added
        self.closed = False  # the client went away or was cut: write nothing more
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.transport = None  # the connection (for its write buffer), when the listener gives it
        self.trace = None  # tracing.CallTrace of a sampled call: its requests carry its traces
        self.watch = None  # metrics.CallWatch of the call (token counts and latencies), when metrics are on
        self._started = False  # the stream's status and headers were sent
        self._waiter: Optional[asyncio.Future] = None

    # ---- submitting ----------------------------------------------------------------------------

    def prepare(self, sampling: dict, seed: Optional[int], copy_limit: int) -> None:
        """Make what the choices share: each prompt's text_input bytes and the sampling fields, once
        (a large body's calls run this off the event loop). With a seed and n > 1 each choice has
        a seed of its own, so its own copy of the sampling fields: those copies together may take
        at most `copy_limit` bytes (the largest body the server takes), else 400 naming it."""
        tm = self.text_model
        self._inputs = [tm.prompt_input(p) for p in self.prompts]
        if not self.echo_here:
            self.prompts = []  # kept only to be echoed
        shared = tm.sampling_input(sampling)
        self._sampling = [shared]
        # What a choice's sampling fields take: the tensor's bytes, or about as much as parameters.
        size = self._sampling_size = len(shared) if isinstance(shared, bytes) else sum(
            len(v) for v in sampling.values() if isinstance(v, msgspec.Raw))
        if seed is None or self.n == 1:
            return
        copies = self.n - 1
        if size * copies > copy_limit:
            raise ApiError(400, f"with 'seed' and n={self.n} each choice gets a copy of the sampling fields of its "
                                f"own ({size} bytes): {size * copies} bytes in all, more than the largest request "
                                f"the server takes ({copy_limit} bytes, --http-max-input-size); ask for fewer "
                                "choices or send fewer fields", param="n")
        self._sampling += [tm.seeded_input(sampling, shared, offset_seed(seed, j)) for j in range(1, self.n)]

    async def submit(self, stream: bool) -> None:
        """Submit every choice (after prepare); ApiError when the core refuses one (the others are cancelled).

        A choice whose inputs are large costs the backend a copy of them (into a worker's shared
        memory) as it is submitted: ~10 ms for 8 MiB. The loop gets a turn between two such choices,
        so n of them never hold it for n copies in a row."""
        self.stream = stream
        if stream:
            opening = self.form.opening(self)
            if opening:
                self._add(opening)
        tm = self.text_model
        parts = self._sampling
        each = len(parts) > 1
        index = 0
        for data in self._inputs:
            large = len(data) + self._sampling_size > YIELD_BYTES
            for j in range(self.n):
                if large and index:
                    await asyncio.sleep(0)
                    if self.closed:
                        return
                request = tm.build(self.id if index == 0 else f"{self.id}-{index}", data, stream,
                                   parts[j] if each else parts[0], self.echo)
                request.on_response = self._responder(index)
                if self.trace is not None:
                    request.trace = self.trace.for_request(index)
                self.requests.append(request)
                try:
                    self.server.submit(request)
                except KernelError as exc:
                    self.requests.pop()
                    self.cancel()
                    raise from_kernel(exc, self.model_name) from None
                index += 1
        self._inputs = self._sampling = ()  # the requests hold them now

    def _responder(self, index: int):
        def on_response(response: InferResponse) -> None:
            self.on_response(index, response)
        return on_response

    def cancel(self) -> None:
        for request in self.requests:
            request.cancel()

    # ---- responses (event loop) ----------------------------------------------------------------

    def on_response(self, index: int, response: InferResponse) -> None:
        if self.finished or self.closed:
            return
        if response.error is not None:
            self._fail(from_kernel(response.error, self.model_name))
            return
        final = response.final
        choice = self.choices[index]
        try:
            text = choice.read(response, final)
        except ApiError as exc:  # a tool_calls or logprobs output the model got wrong
            self._fail(exc)
            return
        except Exception as exc:  # noqa: BLE001 - our fault: the call fails, the callback does not
            log.exception("model '%s': a response could not be read", self.model_name)
            self._fail(ApiError(500, f"internal error reading the model's response: {type(exc).__name__}",
                                SERVER_ERROR))
            return
        if self.echo_here and not self.announced[index]:
            text = self.prompts[index // self.n] + text
        if self.watch is not None:
            self.watch.response(index, choice, bool(text) or bool(choice.calls), final)
        if text or final or choice.calls:
            self.committed = True
            if self.stream:
                self._add(self.form.chunk(self, index, text, final))
            elif text or choice.calls or choice.logprobs:
                if text:
                    self.texts[index].append(text)
                self.text_size += len(text) + _extra_size(choice)
                if self.text_size > _WATCH_BYTES:
                    if self.text_size > self.answer_limit:
                        self._drop_texts()
                        self._fail(self._too_large())
                        return
                    self.server.held_output.watch(self)
            self.announced[index] = True
        if final:
            self.remaining -= 1
            if self.remaining == 0:
                if self.trace is not None:
                    self.trace.answered(response)
                if self.stream:
                    self._add(self.form.closing(self))
                self._finish()
        if self.stream and self.pending_bytes > MAX_PENDING_BYTES and not self.finished:
            self.finished = True  # first: what the cancellation brings back is not added
            self.cancel()
            self._add(self.form.error_event(error_body(
                f"the client read the stream too slowly: more than {MAX_PENDING_BYTES} bytes waited to be sent; "
                "the request was cancelled", SERVER_ERROR, None, "stream_overflow")))
        elif self.pending_bytes > _WATCH_BYTES:
            self.server.held_output.watch(self)

    def _fail(self, error: ApiError) -> None:
        self.finished = True  # first: what the cancellation brings back is not added
        self.cancel()
        if self.committed and self.stream:
            self._add(self.form.error_event(error.body()))
        else:
            self.error = error
        self._wake()

    def _add(self, event: bytes) -> None:
        self.pending.append(event)
        self.pending_bytes += len(event)
        self._wake()

    def _finish(self) -> None:
        self.finished = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # ---- the client ----------------------------------------------------------------------------

    def end(self, reason: str) -> bool:
        """End the call with an error naming `reason` (the server is stopping): a stream gets it as
        its last event, a call that sent nothing yet as its answer (503). False: it had ended."""
        if self.finished or self.closed:
            return False
        self._drop_texts()
        self._fail(ApiError(503, reason, SERVER_ERROR, None, "server_stopping"))
        return True

    def disconnected(self) -> None:
        """The client went away: cancel the requests, write nothing more."""
        self.closed = True
        self.cancel()
        self._wake()

    def held_bytes(self) -> int:
        """kernel.core.holding.Holder: what waits here for this client: a stream's events not yet
        written, or a non-streamed answer's text while it is generated. (What waits in the
        connection's write buffer is the connection's to count: kernel.transports.http_limits.)"""
        if self.stream:
            return self.pending_bytes
        return 0 if self.finished or self.closed else self.text_size

    def cut(self, reason: str) -> None:
        """kernel.core.holding.Holder: drop the client. A stream is reset (it stopped reading); a
        non-streamed answer that has sent nothing yet ends with a 503 naming the reason instead."""
        if not self.stream and not self.closed and not self.finished:
            self._drop_texts()
            self._fail(ApiError(503, f"the answer was dropped: {reason}", SERVER_ERROR, None, "server_overloaded"))
            return
        self.disconnected()
        self.pending.clear()
        self.pending_bytes = 0
        reset(self.transport)

    # ---- writing -----------------------------------------------------------------------------

    async def write_stream(self, send) -> None:
        """Send the events as they come; the status waits for the first response."""
        held = self.server.held_output
        try:
            while True:
                if not self.pending and not self.finished and not self.closed:
                    await self._wait()
                if self.closed:
                    return
                if not self.committed:
                    if self.error is not None:
                        await send_error(send, self.error)
                        return
                    if not self.pending:
                        if self.finished:
                            return
                        continue
                if not self.pending and not self.finished:
                    continue
                data = self.pending[0] if len(self.pending) == 1 else b"".join(self.pending)
                self.pending.clear()
                self.pending_bytes = 0
                done = self.finished
                if not self._started:
                    self._started = True
                    await start_stream(send, self.transport, 200, SSE_HEADERS, data, not done)
                else:
                    await send({"type": "http.response.body", "body": data, "more_body": not done})
                if done:
                    return
        finally:
            held.unwatch(self)

    async def wait_all(self) -> None:
        try:
            while not self.finished and not self.closed:
                await self._wait()
        finally:
            self.server.held_output.unwatch(self)

    def answer(self) -> bytes:
        """The non-streaming answer (after wait_all, without error)."""
        out = _json.encode(self.form.answer(self))
        if len(out) > self.answer_limit:
            raise self._too_large()
        return out

    def _drop_texts(self) -> None:
        self.texts = [[] for _ in self.texts]
        self.text_size = 0

    def _too_large(self) -> ApiError:
        return answer_too_large(self.answer_limit, "ask for fewer tokens or choices, or stream the answer")

    # ---- encoding ------------------------------------------------------------------------------

    def usage(self) -> Optional[dict]:
        if not self.text_model.has_counts:
            return None
        prompt = sum(c.prompt_tokens or 0 for i, c in enumerate(self.choices) if i % self.n == 0)
        completion = sum(c.completion_tokens for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _extra_size(choice) -> int:
    """About how many bytes the calls and log probabilities of a response add to an answer."""
    size = 0
    if choice.calls:
        size += sum(64 + len(c["function"]["arguments"]) + len(c["function"]["name"]) for c in choice.calls)
    if choice.logprobs:
        size += sum(64 + 3 * len(e["token"]) + 64 * len(e.get("top_logprobs", ())) for e in choice.logprobs)
    return size
