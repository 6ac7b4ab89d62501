"""What an operator watches on an OpenAI-serving Kernel (issue 33): token counters and latency
histograms per model on the metrics port, and a stream its client cancelled counted as cancelled
(it was nv_inference_request_success 1, failure{reason="CANCELED"} 0)."""

from __future__ import annotations

import json
import re
import socket
import urllib.request

import pytest

from openai_helpers import OpenAIServer, open_stream, read_events, tiny_lm

HI = [{"role": "user", "content": "tell me about the river"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("operators")
    tiny_lm(repo)
    tiny_lm(repo, "slow_lm", delay_ms=20)
    k = OpenAIServer([repo])
    try:
        yield k.wait_ready()
    finally:
        k.stop()


def _sample(text: str, name: str, model: str) -> float:
    found = re.search(re.escape(name) + r'\{model="' + re.escape(model) + r'",version="1"\} (\S+)', text)
    return float(found.group(1)) if found else -1.0


def test_token_counters_and_latency_histograms(server):
    with server.client() as client:
        usage = [client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=t, seed=1).usage
                 for t in (3, 5)]
        chunks = list(client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=4, seed=1,
                                                     stream=True, stream_options={"include_usage": True}))
    usage.append(chunks[-1].usage)
    text = server.metrics()
    assert _sample(text, "kernel_openai_prompt_tokens_total", "tiny_lm") == sum(u.prompt_tokens for u in usage)
    assert _sample(text, "kernel_openai_generation_tokens_total", "tiny_lm") == 12
    assert _sample(text, "kernel_openai_time_to_first_token_seconds_count", "tiny_lm") == 3
    assert _sample(text, "kernel_openai_e2e_request_latency_seconds_count", "tiny_lm") == 3
    # Between tokens: the streamed call's 3 gaps, and the non-streamed ones' (tiny_lm answers them whole: none).
    assert _sample(text, "kernel_openai_inter_token_latency_seconds_count", "tiny_lm") == 3
    assert "# TYPE kernel_openai_time_to_first_token_seconds histogram" in text
    assert re.search(r'kernel_openai_time_to_first_token_seconds_bucket\{model="tiny_lm",version="1",le="\+Inf"\} 3',
                     text)


def test_a_cancelled_stream_counts_as_cancelled(server):
    sock = open_stream(server.openai_port, {"model": "slow_lm", "messages": HI, "max_tokens": 500, "stream": True})
    assert read_events(sock, 2).startswith(b"HTTP/1.1 200")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    sock.close()
    server.wait_idle("slow_lm")
    text = server.metrics()
    assert _sample(text, "nv_inference_request_success", "slow_lm") == 0
    assert 'nv_inference_request_failure{model="slow_lm",reason="CANCELED",version="1"} 1' in text
    assert 'nv_inference_request_failure{model="slow_lm",reason="BACKEND",version="1"} 0' in text
    with urllib.request.urlopen(f"http://{server.url}/v2/models/slow_lm/stats") as r:
        stats = json.loads(r.read())["model_stats"][0]["inference_stats"]
    assert stats["success"]["count"] == 0 and stats["fail"]["count"] == 1
    # A stream read to its end still counts as a success.
    with server.client() as client:
        list(client.chat.completions.create(model="slow_lm", messages=HI, max_tokens=2, stream=True))
    server.wait_idle("slow_lm")
    assert _sample(server.metrics(), "nv_inference_request_success", "slow_lm") == 1
