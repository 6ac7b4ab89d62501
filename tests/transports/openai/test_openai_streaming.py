"""Streams of the OpenAI API over real sockets: the server-sent events as written, cancellation
when the client goes away (the model sees is_cancelled()), backpressure (429 with Retry-After for a
full queue or a model's in-flight limit), a client that never reads (bounded memory, the model
stopped, the client cut), and the metrics an autoscaler reads."""

from __future__ import annotations

import json
import re
import shutil
import signal
import threading
import time

import openai
import pytest

from openai_helpers import (
    OPENAI_MODELS, OpenAIServer, assert_error_shape, open_stream, read_events, request, tiny_lm,
)

HI = [{"role": "user", "content": "tell me about the river"}]
# A stream of 2,000 words that does not end on its own (vLLM's ignore_eos: no end-of-text word).
LONG = {"model": "slow_lm", "messages": HI, "max_tokens": 2000, "ignore_eos": True, "stream": True}
CANCELLED = re.compile(r"tiny_lm: request '([^']*)' cancelled after (\d+) tokens")


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """tiny_lm at 50 ms a word (slow_lm), one limited to 2 requests in flight (limited_lm), and
    queue_lm (a queue of one), with the histograms of time to first response and between responses."""
    repo = tmp_path_factory.mktemp("repo")
    tiny_lm(repo, "slow_lm", delay_ms=50)
    tiny_lm(repo, "limited_lm", delay_ms=50,
            extra='parameters { key: "max_inflight_requests", value: { string_value: "2" } }\n')
    shutil.copytree(OPENAI_MODELS / "queue_lm", repo / "queue_lm")
    k = OpenAIServer([repo], "--metrics-config", "histogram_latencies=true")
    try:
        yield k.wait_ready()
    finally:
        k.stop()


def test_server_sent_events_as_written(slow):
    status, headers, body = request(slow.openai_port, "POST", "/v1/chat/completions",
                                    {"model": "slow_lm", "messages": HI, "max_tokens": 3, "seed": 1, "stream": True})
    assert status == 200
    assert headers["content-type"] == "text/event-stream; charset=utf-8"
    assert headers["transfer-encoding"] == "chunked"
    events = body.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    docs = [json.loads(e[len(b"data: "):]) for e in events[:-2]]
    assert all(e.startswith(b"data: {") for e in events[:-2])
    assert len(docs) == 3
    assert docs[0]["choices"][0]["delta"] == {"role": "assistant", "content": docs[0]["choices"][0]["delta"]["content"]}
    assert [d["choices"][0]["finish_reason"] for d in docs] == [None, None, "length"]
    assert {d["id"] for d in docs} == {docs[0]["id"]} and {d["object"] for d in docs} == {"chat.completion.chunk"}


def _cancellations(server) -> list[tuple[str, int]]:
    return [(m.group(1), int(m.group(2))) for m in CANCELLED.finditer(server.log())]


def test_a_client_that_goes_away_cancels_the_request_in_the_model(slow):
    before = len(_cancellations(slow))
    sock = open_stream(slow.openai_port, LONG)
    got = read_events(sock, 3)
    assert got.startswith(b"HTTP/1.1 200") and got.count(b"data: ") >= 3
    sock.close()
    assert slow.wait_for_log("tiny_lm: request", times=before + 1, timeout=10)
    request_id, produced = _cancellations(slow)[-1]
    assert request_id.startswith("chatcmpl-") and 3 <= produced < 100  # stopped at once, not after 2000 words
    slow.wait_idle("slow_lm")


def test_every_choice_of_a_dropped_stream_is_cancelled(slow):
    before = len(_cancellations(slow))
    sock = open_stream(slow.openai_port, {**LONG, "n": 3})
    read_events(sock, 3)
    sock.close()
    assert slow.wait_for_log("tiny_lm: request", times=before + 3, timeout=10)
    assert all(n < 100 for _, n in _cancellations(slow)[before:])
    slow.wait_idle("slow_lm")


def test_a_client_that_times_out_cancels_a_non_streaming_request(slow):
    before = len(_cancellations(slow))
    with slow.client(timeout=0.5) as client:
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(model="slow_lm", messages=HI, max_tokens=2000,
                                           extra_body={"ignore_eos": True})
    assert slow.wait_for_log("tiny_lm: request", times=before + 1, timeout=10)
    slow.wait_idle("slow_lm")


def test_a_model_at_its_inflight_limit_answers_429_with_retry_after(slow):
    socks = [open_stream(slow.openai_port, {**LONG, "model": "limited_lm"}) for _ in range(2)]
    try:
        for s in socks:
            read_events(s, 1)
        status, headers, body = request(slow.openai_port, "POST", "/v1/chat/completions",
                                        {"model": "limited_lm", "messages": HI, "max_tokens": 2})
        assert status == 429 and headers["retry-after"] == "1"
        error = assert_error_shape(body)
        assert error["code"] == "rate_limit_exceeded" and "max_inflight_requests" in error["message"]
        with slow.client() as client:
            with pytest.raises(openai.RateLimitError):
                client.chat.completions.create(model="limited_lm", messages=HI, max_tokens=2)
            with pytest.raises(openai.BadRequestError, match="max_inflight_requests"):  # can never fit
                client.chat.completions.create(model="limited_lm", messages=HI, max_tokens=2, n=3)
    finally:
        for s in socks:
            s.close()
    slow.wait_idle("limited_lm")
    with slow.client() as client:  # room again
        assert client.chat.completions.create(model="limited_lm", messages=HI, max_tokens=2).choices


def test_a_full_queue_is_429_here_and_503_on_the_kserve_route(slow):
    """queue_lm runs one request for 1 s and queues one more: a third finds its queue full."""
    results = []

    def occupy():
        results.append(request(slow.openai_port, "POST", "/v1/completions", {"model": "queue_lm", "prompt": "x"}))

    threads = [threading.Thread(target=occupy) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.2)
    status, headers, body = request(slow.openai_port, "POST", "/v1/completions", {"model": "queue_lm", "prompt": "x"})
    kserve_status, _, kserve_body = request(slow.http_port, "POST", "/v2/models/queue_lm/generate",
                                            {"text_input": "x"})
    for t in threads:
        t.join()
    assert status == 429 and headers["retry-after"] == "1"
    assert "Exceeds maximum queue size" in assert_error_shape(body)["message"]
    assert kserve_status == 503 and "Exceeds maximum queue size" in json.loads(kserve_body)["error"]
    assert [r[0] for r in results] == [200, 200]
    assert json.loads(results[0][2])["choices"][0]["text"] == "done"


def test_first_response_and_inter_response_histograms_and_inflight_gauge(slow):
    sock = open_stream(slow.openai_port, LONG)
    try:
        read_events(sock, 2)
        assert slow.metric("nv_inference_inflight_request_count", "slow_lm") == 1
    finally:
        sock.close()
    slow.wait_idle("slow_lm")
    count = slow.metric("nv_inference_first_response_histogram_ms_count", "slow_lm")
    with slow.client() as client:
        list(client.chat.completions.create(model="slow_lm", messages=HI, max_tokens=5, stream=True))
    assert slow.metric("nv_inference_first_response_histogram_ms_count", "slow_lm") == count + 1
    text = slow.metrics()
    assert "# TYPE nv_inference_inter_response_histogram_ms histogram" in text
    gaps = slow.metric("nv_inference_inter_response_histogram_ms_count", "slow_lm")
    total = slow.metric("nv_inference_inter_response_histogram_ms_sum", "slow_lm")
    assert gaps >= 4 and total / gaps >= 40  # 50 ms a word
    assert slow.metric("nv_inference_inflight_request_count", "slow_lm") == 0


# ---- a client that never reads ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flood(tmp_path_factory):
    """tiny_lm as fast as it goes, with a context of 10^6 words; stalled clients are cut after 3 s."""
    repo = tmp_path_factory.mktemp("flood")
    tiny_lm(repo, "fast_lm", context=1_000_000)
    tiny_lm(repo)
    k = OpenAIServer([repo], "--client-stall-timeout-secs", "3")
    try:
        yield k.wait_ready()
    finally:
        k.stop()


def test_a_client_that_never_reads_costs_bounded_memory_and_is_cut(flood):
    rss_before = flood.front_rss_kb()
    socks = [open_stream(flood.openai_port, {"model": "fast_lm", "messages": HI, "max_tokens": 500_000,
                                             "ignore_eos": True, "stream": True}, rcvbuf=4096) for _ in range(8)]
    try:
        # Each stream holds at most ~1 MiB for its client: past that the model is cancelled...
        assert flood.wait_for_log("tiny_lm: request", times=8, timeout=60), flood.log()[-3000:]
        produced = [int(n) for _, n in CANCELLED.findall(flood.log())]
        assert len(produced) == 8 and max(produced) < 100_000  # far from the 500,000 asked for
        # ...and the server serves everyone else meanwhile.
        with flood.client() as client:
            answer = client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=3)
            assert answer.choices[0].finish_reason == "length"
        assert flood.front_rss_kb() - rss_before < 64 * 1024
        # The stalled clients are cut after the stall timeout: their connections end.
        assert flood.wait_for_log("cutting a client", times=8, timeout=20)
        for s in socks:
            s.settimeout(10)
            while True:
                try:
                    chunk = s.recv(1 << 20)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
    finally:
        for s in socks:
            s.close()
    flood.wait_idle("fast_lm")


# ---- shutdown -----------------------------------------------------------------------------------------------


def test_streams_finish_at_shutdown_within_the_exit_timeout(tmp_path):
    """At Ctrl-C a stream that ends within --exit-timeout-secs is written whole; one that would
    not ends with an error event when the timeout is spent (it ended with a bare EOF and an ERROR
    traceback in the log, issue 31 N10), one warning says so, and the server exits."""
    tiny_lm(tmp_path, "slow_lm", delay_ms=50)
    k = OpenAIServer([tmp_path], "--exit-timeout-secs", "6")
    try:
        k.wait_ready()
        short = open_stream(k.openai_port, {**LONG, "max_tokens": 40})  # 2 s of words
        endless = open_stream(k.openai_port, LONG)  # 100 s of words
        first = read_events(short, 1)
        read_events(endless, 1)
        started = time.monotonic()
        k.proc.send_signal(signal.SIGINT)
        whole = first + read_events(short, 1000, timeout=20)
        assert b"data: [DONE]\n\n" in whole
        assert whole.count(b'"content":') == 40
        rest = b""
        endless.settimeout(20)
        while True:
            try:
                chunk = endless.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            rest += chunk
        assert b"[DONE]" not in rest
        assert rest.endswith(b"\r\n0\r\n\r\n")  # the chunked body's end: not a cut
        last = json.loads(rest[:-len(b"\n\n\r\n0\r\n\r\n")].rsplit(b"data: ", 1)[1])
        assert last["error"] == {"message": "the server is stopping and its exit timeout (6 s) is spent",
                                 "type": "server_error", "param": None, "code": "server_stopping"}
        assert k.proc.wait(20) == 0
        assert 5 <= time.monotonic() - started < 15
        log = k.log()
        assert log.count("OpenAI API: 1 call still generating at the exit timeout ended with an error") == 1
        assert "Traceback" not in log and "ERROR" not in log, log[-3000:]
    finally:
        for s in (short, endless):
            s.close()
        k.stop()


def test_a_reader_that_falls_too_far_behind_gets_the_stream_then_an_error_event(flood):
    before = len(CANCELLED.findall(flood.log()))
    sock = open_stream(flood.openai_port, {"model": "fast_lm", "messages": HI, "max_tokens": 500_000,
                                           "ignore_eos": True, "stream": True}, rcvbuf=4096)
    try:
        # A trickle (4 KiB every 0.2 s) until the model is cancelled: far behind it, yet never a reader
        # that reads nothing, which this server cuts after 3 s (on a busy machine that cut came first).
        sock.settimeout(20)
        data = b""
        deadline = time.monotonic() + 60
        while len(CANCELLED.findall(flood.log())) < before + 1:
            assert time.monotonic() < deadline, "the model was never cancelled"
            data += sock.recv(4096)
            time.sleep(0.2)
        while not data.endswith(b"\r\n0\r\n\r\n"):  # the end of the chunked body
            chunk = sock.recv(1 << 20)
            assert chunk, data[-300:]
            data += chunk
    finally:
        sock.close()
    events = [e for e in data.split(b"\n\n") if b"data: " in e]
    last = json.loads(events[-1].split(b"data: ", 1)[1])
    assert last["error"]["code"] == "stream_overflow" and "too slowly" in last["error"]["message"]
    assert b"[DONE]" not in data
    words = sum(e.count(b'"content":') for e in events)
    produced = int(CANCELLED.findall(flood.log())[-1][1])
    assert 1000 < words <= produced  # what was generated before the cut-off was delivered, in order


def test_new_calls_get_503_while_slow_readers_hold_more_than_the_servers_limit(tmp_path):
    tiny_lm(tmp_path, "fast_lm", context=1_000_000)
    k = OpenAIServer([tmp_path], "--max-held-output-bytes", str(64 * 1024), "--client-stall-timeout-secs", "30")
    sock = None
    try:
        k.wait_ready()
        sock = open_stream(k.openai_port, {"model": "fast_lm", "messages": HI, "max_tokens": 500_000,
                                           "ignore_eos": True, "stream": True}, rcvbuf=4096)
        small = {"model": "fast_lm", "messages": HI, "max_tokens": 1}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, _, body = request(k.openai_port, "POST", "/v1/chat/completions", small)
            if status != 200:
                break
            time.sleep(0.05)
        assert status == 503, body
        error = assert_error_shape(body)
        assert error["code"] == "server_overloaded" and "limit of 65536 bytes" in error["message"]
        # The stalled reader is cut (the longest-stalled first, once past the limit): room again.
        assert k.wait_for_log("cutting a client", timeout=30)
        assert request(k.openai_port, "POST", "/v1/chat/completions", small)[0] == 200
    finally:
        if sock is not None:
            sock.close()
        k.stop()
