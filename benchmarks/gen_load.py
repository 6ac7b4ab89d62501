"""A load client for streamed text generation: time to first token and streamed tokens per second.

Three ways to ask for the same 128-token answer, each at a fixed concurrency (every slot sends its
next request as soon as its previous answer ended):

* ``openai``: ``POST /v1/chat/completions`` with ``"stream": true`` (Kernel's OpenAI-compatible API,
  LitServe's ``OpenAISpec``); a token is an SSE event whose ``choices[0].delta.content`` is not empty;
* ``generate_stream``: ``POST /v2/models/<m>/generate_stream`` (Triton's generate extension, real
  Triton and Kernel); a token is an SSE event whose ``text_output`` is not empty;
* ``grpc``: ``ModelStreamInfer`` through ``tritonclient.grpc.aio`` (one bidirectional stream per slot,
  ``enable_empty_final_response`` so the end of each answer is known whatever the model sends last);
* ``openai_tools``: the ``openai`` chat with a ``tools`` list (one function); a model that calls it
  answers one chunk with the whole call (a token: an event with ``delta.tool_calls``);
* ``openai_json``: the ``openai`` chat with ``response_format: json_object`` (tiny_lm streams a short
  JSON object a piece at a time). These two answer fewer than ``max_tokens`` tokens by nature: their
  answers are not checked for length, and their rows compare time to first token and requests/s
  with the plain chat's.

Why a client of our own: perf_analyzer has no time to first token for SSE, and a general HTTP
client costs more CPU per event than the servers do on this 2-core box. This one keeps one HTTP/1.1
keep-alive connection per slot, reads chunked or plain bodies straight off asyncio streams on uvloop,
splits SSE events on blank lines and decodes each event's JSON with msgspec (a few microseconds per
token). Every slot records, per request, the send time, the first token's arrival, the last
arrival and the token count; the point's numbers are taken over a window after a warm-up:

* tokens/s: tokens that ARRIVED inside the window / window length (all slots together);
* TTFT p50/p99: of requests SENT after the window opened (send -> first token event); every slot
  sends at least one such request, so a point has at least `concurrency` samples even when one
  answer takes longer than the window (64 slots: p99 is then close to the slowest of ~64-200);
* ITL p50: per request, (last - first) / (tokens - 1), median over those requests.

Requests ask for ``max_tokens`` 128, ``temperature`` 1.0 (given, since servers' defaults differ)
and ``ignore_eos`` (the vLLM convention tiny_lm follows), so every answer is exactly 128 tokens; the
client checks that and counts short answers as errors.

    python benchmarks/gen_load.py --kind openai --port 9000 --concurrency 16 --duration 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import msgspec

PROMPT = "the cat sees a river in the morning and"
_decode = msgspec.json.Decoder()


@dataclass
class Record:
    sent: float
    first: Optional[float] = None
    last: Optional[float] = None
    tokens: int = 0
    error: Optional[str] = None


@dataclass
class Result:
    kind: str
    concurrency: int
    duration_s: float
    tokens_per_s: float
    requests: int  # sent after the window opened and answered
    ttft_p50_ms: Optional[float]
    ttft_p99_ms: Optional[float]
    itl_p50_ms: Optional[float]
    errors: int
    first_error: Optional[str] = None
    short_answers: int = 0
    tokens_all: int = 0  # every token received, warm-up and tail included (for CPU per token)
    ttft_samples_ms: Optional[list] = None  # with --samples: every TTFT of the point
    extra: dict = field(default_factory=dict)


class Window:
    """Counts tokens that arrive between start and end (set once the warm-up is over)."""

    def __init__(self) -> None:
        self.start = float("inf")
        self.end = float("inf")
        self.tokens = 0
        self.stop = False
        self.think_s = 0.0  # a slot's pause between an answer's end and its next request

    async def think(self) -> None:
        if self.think_s:
            await asyncio.sleep(self.think_s)

    def token(self, t: float) -> None:
        if self.start <= t < self.end:
            self.tokens += 1

    def more(self, records: list) -> bool:
        """Whether a slot sends another request: until the window is over and the slot has sent one
        after the window opened (so every slot gives a TTFT sample, also when one answer takes
        longer than the window)."""
        return not self.stop or not records or records[-1].sent < self.start


# ---- HTTP/1.1 + SSE ---------------------------------------------------------------------------


TOOL = {"type": "function", "function": {"name": "get_weather", "description": "the weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}


def _openai_body(model: str, max_tokens: int, **extra) -> bytes:
    return json.dumps({
        "model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0,
        "messages": [{"role": "user", "content": PROMPT}], **extra,
    }).encode()


def _generate_body(model: str, max_tokens: int) -> bytes:
    return json.dumps({
        "text_input": PROMPT, "stream": True, "exclude_input_in_output": True,
        "sampling_parameters": json.dumps({"max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0}),
    }).encode()


def _openai_tokens(event: bytes) -> int:
    """1 when the event carries text, 0 for the role-only first chunk, the finish chunk or [DONE]."""
    if event == b"[DONE]":
        return 0
    doc = _decode.decode(event)
    if "error" in doc:
        raise RuntimeError(f"error event: {doc['error']}")
    choices = doc.get("choices") or ()
    delta = (choices[0].get("delta") or {}) if choices else {}
    return 1 if delta.get("content") or delta.get("tool_calls") else 0


def _generate_tokens(event: bytes) -> int:
    doc = _decode.decode(event)
    if "error" in doc:
        raise RuntimeError(f"error event: {doc['error']}")
    return 1 if doc.get("text_output") else 0


async def _http_slot(host: str, port: int, path: str, body: bytes, count, window: Window,
                     records: list, expect: int) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    request = head + body
    clock = time.perf_counter
    try:
        while window.more(records):
            await window.think()
            rec = Record(clock())
            records.append(rec)
            writer.write(request)
            status = await reader.readline()
            if not status:
                raise ConnectionError("connection closed")
            chunked, length, close = False, None, False
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                value = value.strip().lower()
                if name == b"transfer-encoding" and b"chunked" in value:
                    chunked = True
                elif name == b"content-length":
                    length = int(value)
                elif name == b"connection" and value == b"close":
                    close = True
            code = int(status.split()[1])
            buf = b""

            def feed(data: bytes) -> None:
                nonlocal buf
                buf += data
                while True:
                    cut = buf.find(b"\n\n")
                    if cut < 0:
                        return
                    raw, buf = buf[:cut], buf[cut + 2:]
                    if not raw.startswith(b"data:"):
                        continue
                    n = count(raw[5:].strip())
                    if n:
                        t = clock()
                        if rec.first is None:
                            rec.first = t
                        rec.last = t
                        rec.tokens += n
                        window.token(t)

            if code != 200:
                if chunked:
                    body_bytes = b""
                    while True:
                        size = int((await reader.readline()).split(b";")[0], 16)
                        data = await reader.readexactly(size + 2)
                        if size == 0:
                            break
                        body_bytes += data[:-2]
                else:
                    body_bytes = await reader.readexactly(length or 0)
                raise RuntimeError(f"HTTP {code}: {body_bytes[:300]!r}")
            if chunked:
                while True:
                    size = int((await reader.readline()).split(b";")[0], 16)
                    if size == 0:
                        await reader.readline()  # the blank line after the last chunk
                        break
                    feed((await reader.readexactly(size + 2))[:-2])
            elif length is not None:
                feed(await reader.readexactly(length))
            else:
                while True:
                    data = await reader.read(65536)
                    if not data:
                        break
                    feed(data)
                close = True
            if rec.tokens != expect and (expect or not rec.tokens):
                rec.error = f"short answer: {rec.tokens} tokens"
            if close:
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
    except Exception as exc:  # noqa: BLE001 - recorded, the point reports it
        if records and records[-1].error is None:
            records[-1].error = f"{type(exc).__name__}: {exc}"
    finally:
        writer.close()


# ---- gRPC stream ------------------------------------------------------------------------------


async def _grpc_slot(url: str, model: str, window: Window, records: list, expect: int) -> None:
    import numpy as np
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    clock = time.perf_counter
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=np.object_))
    stream = grpcclient.InferInput("stream", [1], "BOOL")
    stream.set_data_from_numpy(np.array([True]))
    params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([json.dumps({"max_tokens": expect, "ignore_eos": True, "temperature": 1.0}).encode()],
                                        dtype=np.object_))
    exclude = grpcclient.InferInput("exclude_input_in_output", [1], "BOOL")
    exclude.set_data_from_numpy(np.array([True]))
    inputs = [text, stream, params, exclude]
    outbox: asyncio.Queue = asyncio.Queue()

    async def requests():
        while True:
            item = await outbox.get()
            if item is None:
                return
            yield item

    responses = client.stream_infer(requests())
    try:
        while window.more(records):
            await window.think()
            rec = Record(clock())
            records.append(rec)
            await outbox.put({"model_name": model, "inputs": inputs, "enable_empty_final_response": True})
            async for result, error in responses:
                if error is not None:
                    raise RuntimeError(str(error))
                response = result.get_response()
                if response.outputs:
                    t = clock()
                    if rec.first is None:
                        rec.first = t
                    rec.last = t
                    rec.tokens += 1
                    window.token(t)
                if response.parameters["triton_final_response"].bool_param:
                    break
            if rec.tokens != expect:
                rec.error = f"short answer: {rec.tokens} tokens"
    except Exception as exc:  # noqa: BLE001
        if records and records[-1].error is None:
            records[-1].error = f"{type(exc).__name__}: {exc}"
    finally:
        await outbox.put(None)
        try:
            await client.close()
        except Exception:  # noqa: BLE001
            pass


# ---- one point --------------------------------------------------------------------------------


def _pct(values: list, q: float) -> Optional[float]:
    if not values:
        return None
    values = sorted(values)
    i = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[i]


async def measure(kind: str, host: str, port: int, model: str, concurrency: int, duration: float,
                  warmup: float, max_tokens: int = 128, samples: bool = False, think_ms: float = 0.0) -> Result:
    window = Window()
    window.think_s = think_ms / 1000.0
    slots: list[list] = [[] for _ in range(concurrency)]
    if kind == "grpc":
        coros = [_grpc_slot(f"{host}:{port}", model, window, s, max_tokens) for s in slots]
    else:
        if kind == "openai":
            path, body, count = "/v1/chat/completions", _openai_body(model, max_tokens), _openai_tokens
        elif kind == "openai_tools":
            path, body, count = "/v1/chat/completions", _openai_body(model, max_tokens, tools=[TOOL]), _openai_tokens
        elif kind == "openai_json":
            path, body, count = ("/v1/chat/completions",
                                 _openai_body(model, max_tokens, response_format={"type": "json_object"}), _openai_tokens)
        elif kind == "generate_stream":
            path, body, count = f"/v2/models/{model}/generate_stream", _generate_body(model, max_tokens), _generate_tokens
        else:
            raise ValueError(kind)
        expect = max_tokens if kind in ("openai", "generate_stream") else 0  # 0: any length
        coros = [_http_slot(host, port, path, body, count, window, s, expect) for s in slots]
    tasks = [asyncio.ensure_future(c) for c in coros]
    await asyncio.sleep(warmup)
    window.start = time.perf_counter()
    await asyncio.sleep(duration)
    window.end = time.perf_counter()
    window.stop = True
    done, pending = await asyncio.wait(tasks, timeout=120)
    for t in pending:
        t.cancel()
    span = window.end - window.start
    inside = [r for s in slots for r in s if window.start <= r.sent]
    ok = [r for r in inside if r.error is None and r.first is not None]
    bad = [r for s in slots for r in s if r.error is not None]
    ttft = [(r.first - r.sent) * 1e3 for r in ok]
    itl = [(r.last - r.first) * 1e3 / (r.tokens - 1) for r in ok if r.tokens > 1]
    return Result(
        kind=kind, concurrency=concurrency, duration_s=round(span, 3), tokens_per_s=window.tokens / span,
        requests=len(ok), ttft_p50_ms=_pct(ttft, 0.5), ttft_p99_ms=_pct(ttft, 0.99),
        itl_p50_ms=statistics.median(itl) if itl else None, errors=len(bad),
        first_error=bad[0].error if bad else None,
        short_answers=sum(1 for r in bad if r.error and r.error.startswith("short answer")),
        tokens_all=sum(r.tokens for s in slots for r in s),
        ttft_samples_ms=[round(v, 4) for v in ttft] if samples else None,
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kind", choices=["openai", "openai_tools", "openai_json", "generate_stream", "grpc"], required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="tiny_lm")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=5.0, help="measured window, seconds")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before the window opens")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--samples", action="store_true", help="also list every time to first token")
    p.add_argument("--think-ms", type=float, default=0.0,
                   help="each slot waits this long after an answer before its next request (the server idles)")
    a = p.parse_args(argv)
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    result = run(measure(a.kind, a.host, a.port, a.model, a.concurrency, a.duration, a.warmup, a.max_tokens,
                         a.samples, a.think_ms))
    print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main()
