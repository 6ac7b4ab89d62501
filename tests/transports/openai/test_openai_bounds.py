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
from openai_helpers import LiveProbe, OpenAIServer, assert_error_shape, request, tiny_lm

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
    assert error["message"] == ("the model's chat template failed on these messages: TypeError: unsupported "
                                "operand type(s) for /: 'str' and 'int'")
    status, error = _refused(server, "syntax_lm")
    assert status == 500 and error["message"].startswith("the model's chat template does not compile: ")
    for message in (error["message"], _refused(server, "broken_lm")[1]["message"]):
        assert str(repo) not in message and "chat_template.jinja" not in message
    # The server's log names the file.
    assert server.wait_for_log(str(repo / "syntax_lm" / "chat_template.jinja"))


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
