"""Bounds on the OpenAI API's work and memory (issue 31): what one call may cost the front.

Each attack runs against a real `kernel serve --openai-port` while /v2/health/live is asked one
request after another (openai_helpers.LiveProbe): the event loop stays free (p99 under 100 ms,
none over 1 s), the front's heap (RssAnon: without the shared-memory arena) stays within a stated
bound, and the client gets an answer that names the limit it met.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from conftest import EXAMPLES, TEST_MODELS
from openai_helpers import LiveProbe, OpenAIServer, assert_error_shape, request, rss_kb, tiny_lm

MIB = 1 << 20
MAX_INPUT = 16 * MIB
BOUNDS_MODELS = TEST_MODELS / "openai_bounds"
TEMPLATES = {
    # Ten billion iterations that print nothing: only the time limit stops it.
    "runaway_lm": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    # Prints the message 100,000 times: passes the prompt limit.
    "wordy_lm": "{% for i in range(100000) %}{{ messages[0]['content'] }}{% endfor %}",
    # Builds a 3 GB string it never prints: passes the renderer's memory.
    "greedy_lm": "{{ messages[0]['content'].ljust(3000000000) | length }}",
    # Fails on every message.
    "broken_lm": "{{ messages[0]['content'] / 2 }}",
    # Does not compile.
    "syntax_lm": "{% for %}",
    # A working one: the renderer serves the next call after a render was stopped.
    "plain_template_lm": "{% for m in messages %}{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}assistant>",
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("bounds")
    for name, text in TEMPLATES.items():
        (tiny_lm(repo, name) / "chat_template.jinja").write_text(text)
    tiny_lm(repo)
    return repo


@pytest.fixture(scope="module")
def server(repo):
    k = OpenAIServer([repo, BOUNDS_MODELS], "--http-max-input-size", str(MAX_INPUT))
    try:
        yield k.wait_ready()
    finally:
        k.stop()


def post(server, body, path="/v1/chat/completions", timeout=120.0):
    return request(server.openai_port, "POST", path, body, timeout=timeout)


def compact(doc) -> bytes:
    """A body as JSON without spaces, made before a LiveProbe starts (the probe shares this process's GIL)."""
    return json.dumps(doc, separators=(",", ":")).encode()


def chat(model: str, content: str = "hello", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 2, **extra}


# ---- N2: the choices of a call share its inputs ----------------------------------------------------------


def test_n_choices_share_a_large_prompt(server):
    """An 8 MiB prompt with n=128 took the front from 53 MB to 2.1 GB and froze it for seconds: each
    choice copied the prompt. Now the choices share it: the heap grows by a few copies of the body
    (bound: 6 x 8 MiB + 64 MiB), not by n of them."""
    call = compact({"model": "blob_lm", "prompt": "x" * (8 * MIB), "n": 128, "max_tokens": 1})  # one word
    with LiveProbe(server) as probe:
        status, _, body = post(server, call, "/v1/completions")
    assert status == 200, body[:300]
    answer = json.loads(body)
    assert [c["text"] for c in answer["choices"]] == ["ok"] * 128
    probe.assert_free()
    assert probe.anon_growth_mib() < 6 * 8 + 64, probe.anon_growth_mib()


def test_n_choices_share_extra_fields_and_seeded_copies_are_bounded(server):
    """A 5.7 MiB body with an extra field of 2M integers and n=128 froze the front 4.5-8.3 s: every
    choice decoded and encoded the field again. Now it is passed on as sent, once for all choices;
    with a seed each choice needs a copy of its own, and copies past --http-max-input-size are refused."""
    extra = [i % 100 for i in range(2_000_000)]
    call, seeded = (compact({**chat("blob_lm", n=128), "my_numbers": extra, **more}) for more in ({}, {"seed": 5}))
    assert 5 * MIB < len(call) < 6 * MIB
    with LiveProbe(server) as probe:
        status, _, body = post(server, call)
        assert status == 200, body[:300]
        assert len(json.loads(body)["choices"]) == 128
        status, _, body = post(server, seeded)
    probe.assert_free()
    assert probe.anon_growth_mib() < 6 * 16 + 64, probe.anon_growth_mib()
    assert status == 400, body[:300]
    error = assert_error_shape(body)
    assert error["param"] == "n" and "--http-max-input-size" in error["message"]
    assert f"({MAX_INPUT} bytes" in error["message"]


def test_extra_fields_reach_the_model_as_sent(server):
    """What the choices share is what each would have had: tiny_lm answers the same words."""
    call = {"model": "tiny_lm", "prompt": "the cat", "max_tokens": 6, "seed": 3, "n": 3, "top_k": 5,
            "my_list": [1, 2, {"a": None}]}
    status, _, body = post(server, call, "/v1/completions")
    assert status == 200, body
    together = [c["text"] for c in json.loads(body)["choices"]]
    for i, text in enumerate(together):
        alone = post(server, {**call, "n": 1, "seed": 3 + i}, "/v1/completions")
        assert json.loads(alone[2])["choices"][0]["text"] == text


# ---- N5, N13: chat templates render beside the loop, bounded ------------------------------------------------


def _refused(server, model: str, content: str = "hello", timeout: float = 60.0) -> tuple[int, dict]:
    status, _, body = post(server, chat(model, content), timeout=timeout)
    return status, assert_error_shape(body)


def test_a_runaway_template_is_stopped_and_the_server_stays_live(server, repo):
    with LiveProbe(server) as probe:
        started = time.monotonic()
        status, error = _refused(server, "runaway_lm")
        took = time.monotonic() - started
    assert status == 400 and error["param"] == "messages" and error["code"] == "chat_template_limit"
    assert "did not finish rendering these messages within 5 s" in error["message"]
    assert 4.5 < took < 30
    probe.assert_free()
    # The next render gets a fresh renderer.
    status, _, body = post(server, chat("plain_template_lm"))
    assert status == 200, body


def test_a_template_that_prints_or_builds_too_much_is_refused(server):
    with LiveProbe(server) as probe:
        status, error = _refused(server, "wordy_lm", "w" * 1000)
        assert status == 400 and error["code"] == "chat_template_limit"
        assert f"passed {MAX_INPUT} bytes" in error["message"] and "--http-max-input-size" in error["message"]
        status, error = _refused(server, "greedy_lm")
        assert status == 400 and error["code"] == "chat_template_limit"
        assert "more memory than a render may take" in error["message"]
    probe.assert_free()
    assert probe.anon_growth_mib() < 64, probe.anon_growth_mib()
    status, _, body = post(server, chat("plain_template_lm"))
    assert status == 200, body


def test_template_errors_do_not_tell_the_client_server_paths(server, repo):
    status, error = _refused(server, "broken_lm")
    assert status == 400 and error["param"] == "messages"
    assert error["message"] == ("the chat template of model 'broken_lm' failed on these messages: TypeError: "
                                "unsupported operand type(s) for /: 'str' and 'int'")
    status, error = _refused(server, "syntax_lm")
    assert status == 500 and error["message"].startswith("the chat template of model 'syntax_lm' does not compile: ")
    for message in (error["message"], _refused(server, "broken_lm")[1]["message"]):
        assert str(repo) not in message and "chat_template.jinja" not in message
    # The server's log names the file.
    assert server.wait_for_log(str(repo / "syntax_lm" / "chat_template.jinja"))
    assert server.wait_for_log("model 'syntax_lm': its chat template")


def test_a_server_rendering_a_runaway_template_stops_on_sigterm(repo):
    k = OpenAIServer([repo], "--exit-timeout-secs", "2")
    try:
        k.wait_ready()
        import threading

        def call() -> None:
            try:
                post(k, chat("runaway_lm"))
            except OSError:
                pass  # the connection of a render still running at the exit timeout is closed

        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(1.0)
        started = time.monotonic()
        k.proc.send_signal(signal.SIGTERM)
        assert k.proc.wait(30) == 0
        assert time.monotonic() - started < 10
        caller.join(30)
    finally:
        k.stop()


# ---- N7: embeddings are written beside the loop, in pieces, within the JSON limit ------------------------------


def _expected_embeddings(dims: list[int], base64_format: bool) -> bytes:
    """The answer as the whole of it encoded at once would read (what Kernel answered before)."""
    import base64

    import msgspec
    import numpy as np

    data = []
    for i, d in enumerate(dims):
        vector = np.arange(d, dtype=np.float32) / 8
        value = base64.b64encode(vector.astype("<f4").tobytes()).decode() if base64_format else vector.tolist()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return msgspec.json.encode({"object": "list", "data": data, "model": "wide_embed",
                                "usage": {"prompt_tokens": 0, "total_tokens": 0}})


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_embeddings_answers_are_byte_for_byte_those_encoded_at_once(server, encoding):
    dims = [40000, 3, 0, 16385]  # pieces of 16,384 numbers: more than two, exactly one, none, one and one more
    call = {"model": "wide_embed", "input": [str(d) for d in dims], "encoding_format": encoding}
    status, _, body = post(server, call, "/v1/embeddings")
    assert status == 200, body[:300]
    assert body == _expected_embeddings(dims, encoding == "base64")


def test_wide_embeddings_do_not_stop_the_loop_and_past_the_limit_are_refused(server):
    """2048 x 4096 numbers (~55 MB of JSON) froze the front 0.6-2.8 s; one 10M-number vector 1.3-3.8 s
    and took its heap up by ~0.5 GB. Now the answer is written in pieces beside the loop, and one
    that would pass --http-max-json-output-size (64 MiB) is refused naming it; the heap grows by at
    most the answer: bound 2 x 64 MiB + 64 MiB."""
    wide = compact({"model": "wide_embed", "input": ["4096"] * 2048, "encoding_format": "float"})
    huge = compact({"model": "wide_embed", "input": ["10000000"], "encoding_format": "float"})
    with LiveProbe(server) as probe:
        status, _, body = post(server, wide, "/v1/embeddings")
        assert status == 200, body[:300]
        status, _, refused = post(server, huge, "/v1/embeddings")
    probe.assert_free()
    assert probe.anon_growth_mib() < 2 * 64 + 64, probe.anon_growth_mib()
    assert 40 * MIB < len(body) < 64 * MIB
    doc = json.loads(body)  # after the probe: it shares this process's GIL
    assert len(doc["data"]) == 2048 and doc["data"][2047]["embedding"][:3] == [0.0, 0.125, 0.25]
    assert status == 400, refused[:300]
    error = assert_error_shape(refused)
    assert error["code"] == "answer_too_large" and "--http-max-json-output-size" in error["message"]
    assert f"passed {64 * MIB} bytes" in error["message"]


# ---- N12: a non-streamed completion's text is capped ----------------------------------------------------------


def test_a_non_streamed_answer_past_the_json_limit_is_refused(server):
    """A 293 MiB answer peaked the front at 1.2-2.7 GB. Now the text is counted as it comes, and past
    --http-max-json-output-size (64 MiB) the call is cancelled and refused naming that limit: the
    heap grows by at most the limit, twice (text and answer), plus 64 MiB."""
    call = compact({"model": "blob_lm", "prompt": "80 1048576"})  # 80 MiB of text
    with LiveProbe(server) as probe:
        status, _, body = post(server, call, "/v1/completions")
    probe.assert_free()
    assert probe.anon_growth_mib() < 2 * 64 + 64, probe.anon_growth_mib()
    assert status == 400, body[:300]
    error = assert_error_shape(body)
    assert error["code"] == "answer_too_large" and "--http-max-json-output-size" in error["message"]
    # Under the limit the whole text comes back.
    status, _, body = post(server, compact({"model": "blob_lm", "prompt": "30 1048576"}), "/v1/completions")
    assert status == 200 and json.loads(body)["choices"][0]["text"] == "a" * (30 * MIB)


# ---- N4: answers a client does not read are counted and cut --------------------------------------------------


def _never_reading(port: int, path: str, body: dict):
    import socket

    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % (path.encode(), len(data)) + data)
    return s


def _until_closed(s, timeout: float) -> tuple[int, bool]:
    """(bytes read, whether the server closed or reset the connection within `timeout` s; an answer
    that came whole counts as closed)."""
    import socket

    got = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = s.recv(1 << 20)
        except socket.timeout:
            return got, False
        except ConnectionResetError:
            return got, True
        if not chunk:
            return got, True
        got += len(chunk)
        if got < 1000 and chunk.startswith(b"HTTP/1.1 503") and chunk.endswith(b"}}"):
            return got, True
    return got, False


def test_non_streamed_answers_to_clients_that_do_not_read_are_counted_and_cut(repo):
    """40 readers that never read held 2.3 GB, and 33 were still open long past the stall timeout.
    Now what waits in their connections is in --max-held-output-bytes: new calls get 503 while it
    is over, the stalled are cut (the client sees its connection end), their memory is freed."""
    k = OpenAIServer([BOUNDS_MODELS], "--max-held-output-bytes", str(16 * MIB), "--client-stall-timeout-secs", "2")
    socks = []
    try:
        k.wait_ready()
        anon_before = rss_kb(k.proc.pid, "RssAnon")
        calls = [("/v1/completions", {"model": "blob_lm", "prompt": "8 1048576"})] * 3 + [
            ("/v1/chat/completions", {"model": "blob_lm", "messages": [{"role": "user", "content": "8 1048576"}]})] * 3 + [
            ("/v1/embeddings", {"model": "wide_embed", "input": ["4096"] * 512, "encoding_format": "float"})] * 2
        socks = [_never_reading(k.openai_port, path, body) for path, body in calls]
        refused = False
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not refused:
            status, _, body = request(k.openai_port, "POST", "/v1/completions", {"model": "blob_lm", "prompt": "x"})
            refused = status == 503
            time.sleep(0.05)
        assert refused, "no call was refused while the readers held more than the limit"
        assert "limit of 16777216 bytes" in assert_error_shape(body)["message"]  # (with several fronts: "its share ... of the server's limit of")
        # Over the limit the longest-stalled are cut at once, the rest after the stall timeout (2 s);
        # calls that came while the total was over the limit were refused (a small 503 that went at once).
        time.sleep(5)
        cut = 0
        for s in socks:
            got, closed = _until_closed(s, 10)
            assert closed, got
            cut += got > 1000
            assert got < 8 * MIB
        assert cut >= 3 and k.log().count("cutting a client") == cut
        assert request(k.openai_port, "POST", "/v1/completions", {"model": "blob_lm", "prompt": "x"})[0] == 200
        assert rss_kb(k.proc.pid, "RssAnon") - anon_before < 64 * 1024
    finally:
        for s in socks:
            s.close()
        k.stop()
