"""The generative benchmark's measuring parts: tiny_lm samples what it always sampled, and the load
client (benchmarks/gen_load.py) counts every streamed token of a real `kernel serve`.

The benchmark's numbers are only as good as these two: a tiny_lm that sampled differently would
change the answers of seeded requests (and what real Triton answers for the same model.py), and a
client that dropped or double-counted events would misreport tokens/s.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import shutil
import socket
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import EXAMPLES
from openai_helpers import OpenAIServer

ROOT = Path(__file__).resolve().parents[3]
TINY_LM = EXAMPLES / "tiny_lm"


def _tiny_lm():
    spec = importlib.util.spec_from_file_location("tiny_lm_model_under_test", TINY_LM / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps({"parameters": {}})})
    return module, model


def _reference_next(model, module, previous, counts, job, rng):
    """tiny_lm's sampling as first written: numpy's rng.choice over the softmax."""
    logits = model.scores[previous] - job["presence_penalty"] * (counts > 0) - job["frequency_penalty"] * counts
    if job["ignore_eos"]:
        logits[module.END] = -np.inf
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
    return int(rng.choice(len(module.VOCAB), p=probs))


def test_tiny_lm_draws_the_words_rng_choice_draws():
    """The cheaper sampling (a cumulative sum and one uniform draw) picks, from the same seed, the
    very words rng.choice picked, for every sampling setting; and leaves the score table alone."""
    module, model = _tiny_lm()
    table = model.scores.copy()
    settings = itertools.product([0, 0.5, 1.0, 1.7], [1.0, 0.9, 0.3], [0.0, 0.5], [0.0, 0.8], [False, True], range(3))
    for temperature, top_p, presence, frequency, ignore_eos, seed in settings:
        job = {"presence_penalty": presence, "frequency_penalty": frequency, "ignore_eos": ignore_eos,
               "temperature": temperature, "top_p": top_p}
        words = []
        for sample in (model._next, lambda *a: _reference_next(model, module, *a)):
            rng = np.random.default_rng([seed, 7])
            counts = np.zeros(len(module.VOCAB))
            previous, drawn = seed % 50, []
            for _ in range(60):
                word = sample(previous, counts, job, rng)
                drawn.append(word)
                if word != module.END:
                    counts[word] += 1
                    previous = word
            words.append(drawn)
        assert words[0] == words[1], job
        if ignore_eos:
            assert module.END not in words[0]
    assert np.array_equal(model.scores, table)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    repo = tmp_path_factory.mktemp("generative")
    shutil.copytree(TINY_LM, repo / "tiny_lm")
    k = OpenAIServer([repo])
    try:
        yield k.wait_ready()
    finally:
        k.stop()


@pytest.mark.parametrize("kind", ["openai", "generate_stream", "grpc"])
def test_load_client_counts_every_token(kernel, kind):
    """Every answer is exactly max_tokens long and every token is counted once, on each route."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gen_load
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    port = {"openai": kernel.openai_port, "generate_stream": kernel.http_port, "grpc": kernel.grpc_port}[kind]
    result = asyncio.run(gen_load.measure(kind, "127.0.0.1", port, "tiny_lm", 3, duration=0.5, warmup=0.2,
                                          max_tokens=24))
    assert result.errors == 0, result.first_error
    assert result.requests >= 3  # every slot sends one after the window opened
    assert result.tokens_all % 24 == 0 and result.tokens_all >= 24 * result.requests
    assert result.tokens_per_s > 0
    assert 0 < result.ttft_p50_ms <= result.ttft_p99_ms


@pytest.mark.parametrize("kind", ["generate_stream", "grpc"])
def test_load_client_pauses_between_a_slots_requests(kernel, kind):
    """--think-ms (benchmarks/ttft_idle.py): one slot waits 100 ms after each answer, so a 0.6 s
    window sees a handful of requests, not hundreds, and every one still answers."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gen_load
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    port = {"generate_stream": kernel.http_port, "grpc": kernel.grpc_port}[kind]
    result = asyncio.run(gen_load.measure(kind, "127.0.0.1", port, "tiny_lm", 1, duration=0.6, warmup=0.2,
                                          max_tokens=1, samples=True, think_ms=100))
    assert result.errors == 0, result.first_error
    assert 3 <= result.requests <= 8, result.requests  # back to back: hundreds in 0.6 s
    assert len(result.ttft_samples_ms) == result.requests
    assert max(result.ttft_samples_ms) < 100  # the pause comes before the request is sent, outside the TTFT


@pytest.mark.parametrize("kind, tokens", [("openai_tools", 1), ("openai_json", 7)])
def test_load_client_counts_tool_calls_and_json_pieces(kernel, kind, tokens):
    """The tool-calling and JSON-mode rows: a call is one token (one chunk with the whole call), a
    JSON answer `{"answer": "<6 words>"}` streams as about 7 pieces; neither is a short-answer error."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gen_load
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    result = asyncio.run(gen_load.measure(kind, "127.0.0.1", kernel.openai_port, "tiny_lm", 2, duration=0.5,
                                          warmup=0.2, max_tokens=24))
    assert result.errors == 0, result.first_error
    assert result.requests >= 2 and result.tokens_all >= (tokens - 2) * result.requests
    if kind == "openai_tools":
        assert result.tokens_all % tokens == 0
    assert 0 < result.ttft_p50_ms <= result.ttft_p99_ms


def _data_segments_in(sock: socket.socket) -> int:
    """tcpi_data_segs_in of the connection's TCP_INFO (Linux 4.6+): segments received that carried data."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("I", info, 152)[0]


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="TCP_INFO is Linux's")
def test_status_line_and_first_event_arrive_in_one_segment(kernel):
    """A stream's status line and headers travel with its first event, not a segment ahead of it:
    a segment of headers alone wakes the client for nothing and delays the first token (~0.4 ms at
    concurrency 1 on a busy 2-core box); tritonserver's generate_stream sends them together too.
    A one-token answer (event, [DONE], the chunked end) is then one segment in all."""
    body = json.dumps({"model": "tiny_lm", "stream": True, "max_tokens": 1, "ignore_eos": True,
                       "messages": [{"role": "user", "content": "the cat"}]}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", kernel.openai_port), timeout=30) as sock:
            sock.sendall(request)
            answer = b""
            while not answer.endswith(b"0\r\n\r\n"):
                data = sock.recv(65536)
                assert data, answer
                answer += data
            assert answer.startswith(b"HTTP/1.1 200")
            assert answer.count(b"data: ") == 2 and b"data: [DONE]" in answer
            assert _data_segments_in(sock) == 1, answer
