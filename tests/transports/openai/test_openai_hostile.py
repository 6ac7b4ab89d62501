"""Hostile input on the OpenAI port, over raw sockets: each is a 4xx in OpenAI's error shape naming
the problem, the server keeps serving everyone else, and its memory stays bounded."""

from __future__ import annotations

import json
import socket

import pytest

from conftest import EXAMPLES
from openai_helpers import OpenAIServer, assert_error_shape, open_stream, read_events, request

HI = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server():
    # Bodies up to 16 MiB: a 10 MB message is read whole and refused by the model (its context);
    # the 413 of a body over the limit is checked with a larger one.
    k = OpenAIServer([EXAMPLES], "--http-max-input-size", str(16 << 20))
    try:
        yield k.wait_ready()
    finally:
        k.stop()


def post(server, body, path="/v1/chat/completions", headers=None):
    return request(server.openai_port, "POST", path, body, headers)


def still_serves(server) -> None:
    status, _, body = post(server, {"model": "tiny_lm", "messages": HI, "max_tokens": 2})
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("body, param, words", [
    (b"{", None, "not valid JSON"),
    (b"[1, 2]", None, "must be a JSON object"),
    (b"", None, "empty"),
    (b"\xff\xfe{}", None, "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, None, "JSON"),
    ({"messages": HI}, "model", "model"),
    ({"model": "tiny_lm"}, "messages", "messages"),
    ({"model": "tiny_lm", "messages": []}, "messages", "messages"),
    ({"model": "tiny_lm", "messages": "hello"}, "messages", "Expected `array"),
    ({"model": "tiny_lm", "messages": [{"content": "x"}]}, "messages", "role"),
    ({"model": 7, "messages": HI}, "model", "Expected `str`"),
    ({"model": "tiny_lm", "messages": HI, "n": "2"}, "n", "Expected `int"),
    ({"model": "tiny_lm", "messages": HI, "n": 10_000}, "n", "<= 128"),
    ({"model": "tiny_lm", "messages": HI, "n": 0}, "n", ">= 1"),
    ({"model": "tiny_lm", "messages": HI, "max_tokens": 2 ** 40}, "max_tokens", "<= 2147483647"),
    ({"model": "tiny_lm", "messages": HI, "max_tokens": -1}, "max_tokens", ">= 1"),
    ({"model": "tiny_lm", "messages": HI, "max_completion_tokens": 1.5}, "max_completion_tokens", "Expected `int"),
    ({"model": "tiny_lm", "messages": HI, "temperature": 7}, "temperature", "<= 2.0"),
    ({"model": "tiny_lm", "messages": HI, "top_p": "high"}, "top_p", "Expected `float"),
    ({"model": "tiny_lm", "messages": HI, "stop": 3}, "stop", "Expected `str | array"),
    ({"model": "tiny_lm", "messages": HI, "stop": ["x"] * 100}, "stop", "length <= 16"),
    ({"model": "tiny_lm", "messages": HI, "seed": 2 ** 70}, "seed", "64-bit"),
    ({"model": "tiny_lm", "messages": HI, "stream": "yes"}, "stream", "Expected `bool"),
    ({"model": "tiny_lm", "messages": HI, "stream_options": []}, "stream_options", "Expected `object"),
    ({"model": "tiny_lm", "messages": HI, "tools": [{"type": "function"}]}, "tools", "`function`"),
    ({"model": "tiny_lm", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages", "image_url"),
])
def test_malformed_requests_are_400_naming_the_problem(server, body, param, words):
    status, _, answer = post(server, body)
    assert status == 400, answer
    error = assert_error_shape(answer)
    assert error["type"] == "invalid_request_error"
    assert words in error["message"]
    if param is not None:
        assert error["param"] == param


def test_completions_and_embeddings_refuse_bad_inputs(server):
    for path, body, words in (
        ("/v1/completions", {"model": "tiny_lm"}, "'prompt' is required"),
        ("/v1/completions", {"model": "tiny_lm", "prompt": [1, 2, 3]}, "Expected `str`"),
        ("/v1/completions", {"model": "tiny_lm", "prompt": ["x"] * 100, "n": 2}, "at most 128 choices"),
        ("/v1/completions", {"model": "tiny_lm", "prompt": "x", "suffix": "y"}, "suffix"),
        ("/v1/embeddings", {"model": "tiny_lm", "input": [[1, 2]]}, "Expected `str`"),
        ("/v1/embeddings", {"model": "tiny_lm", "input": ["x"] * 5000}, "length <= 2048"),
    ):
        status, _, answer = post(server, body, path)
        assert status == 400, answer
        assert words in assert_error_shape(answer)["message"]
    still_serves(server)


def test_a_10_mb_message_is_refused_by_the_model_and_a_larger_body_by_the_limit(server):
    words = ("river " * (10 * 1024 * 1024 // 6)).strip()
    status, _, answer = post(server, {"model": "tiny_lm", "messages": [{"role": "user", "content": words}]})
    assert status == 400
    assert "maximum context length is 4096" in assert_error_shape(answer)["message"]
    status, _, answer = post(server, b"x" * (17 << 20))
    assert status == 413
    error = assert_error_shape(answer)
    assert error["code"] == "content_too_large" and "--http-max-input-size" in error["message"]
    still_serves(server)


def test_a_body_announced_larger_than_the_limit_is_refused_before_it_is_read(server):
    with socket.create_connection(("localhost", server.openai_port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n{" % (1 << 40))
        answer = b""
        while b"}}" not in answer:  # the headers and the JSON body may come in two reads
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413")
    assert b"content_too_large" in answer
    still_serves(server)


def test_many_streams_opened_and_dropped(server):
    """1,000 streaming calls whose clients go away, 50 at a time: each is cancelled in the model,
    nothing stays in flight, memory stays flat, and the server answers the next client."""
    body = {"model": "tiny_lm", "messages": HI, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    still_serves(server)
    rss_before = server.front_rss_kb()
    cancelled_before = server.log().count("tiny_lm: request")
    for _ in range(20):
        socks = [open_stream(server.openai_port, body) for _ in range(50)]
        for s in socks:
            assert read_events(s, 1).startswith(b"HTTP/1.1 200")  # the stream began: the model is generating
        for s in socks:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
            s.close()
    server.wait_idle("tiny_lm", timeout=60)
    assert server.wait_for_log("tiny_lm: request", times=cancelled_before + 1000, timeout=30)
    assert server.front_rss_kb() - rss_before < 64 * 1024
    still_serves(server)
    status, _, answer = request(server.openai_port, "GET", "/v1/models")
    assert status == 200 and "tiny_lm" in [m["id"] for m in json.loads(answer)["data"]]


# ---- the fields of issue 33: tools, response_format, logprobs, the Responses API ----------------------

_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def _deep(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize("fields, param, words", [
    ({"tools": "f"}, "tools", "Expected `array"),
    ({"tools": [_TOOL] * 10_000}, "tools", "length <= 128"),
    ({"tools": [{"type": "retrieval"}]}, "tools", "Invalid enum value 'retrieval'"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "matching regex"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": _deep(40)}}]}, "tools",
     "nested more than 32 levels"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": _deep(300)}}]}, "tools",
     "nested more than 32 levels"),
    ({"tools": [_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "'nope', which is not one of the tools"),
    ({"tools": [_TOOL], "tool_choice": "sometimes"}, "tool_choice", "must be one of none, auto, required"),
    ({"tool_choice": "auto"}, "tool_choice", "only allowed when 'tools' are given"),
    ({"parallel_tool_calls": True}, "parallel_tool_calls", "only allowed when 'tools'"),
    ({"tools": [_TOOL], "functions": [_TOOL["function"]]}, "functions", "not both"),
    ({"functions": [_TOOL["function"]], "function_call": {"name": "g"}}, "function_call", "'g'"),
    ({"response_format": {"type": "xml"}}, "response_format", "Invalid enum value 'xml'"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs its 'json_schema'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": _deep(40)}}},
     "response_format", "nested more than 32 levels"),
    ({"logprobs": "yes"}, "logprobs", "Expected `bool"),
    ({"logprobs": True, "top_logprobs": 10 ** 9}, "top_logprobs", "<= 20"),
    ({"top_logprobs": 2}, "top_logprobs", "needs 'logprobs': true"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "may not set messages"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": 3}}]}]}, "messages",
     "Expected `str`"),
])
def test_hostile_feature_fields_are_400_naming_the_field(server, fields, param, words):
    status, _, answer = post(server, {"model": "tiny_lm", "messages": HI, **fields})
    assert status == 400, answer
    error = assert_error_shape(answer)
    assert words in error["message"], error
    if param is not None:
        assert error["param"] == param
    assert request(server.openai_port, "GET", "/health")[0] == 200


def test_hostile_responses_and_tokenizer_bodies(server):
    for path, body, param, words in (
        ("/v1/responses", {"model": "tiny_lm"}, "input", "input"),
        ("/v1/responses", {"model": "tiny_lm", "input": 5}, "input", "Expected `str | array"),
        ("/v1/responses", {"model": "tiny_lm", "input": "x", "tools": [{"type": "function", "name": "f"}] * 500},
         "tools", "length <= 128"),
        ("/v1/responses", {"model": "tiny_lm", "input": [{"type": "function_call"}]}, "input", "call_id and name"),
        ("/v1/responses", {"model": "tiny_lm", "input": "x", "max_output_tokens": -5}, "max_output_tokens", ">= 1"),
        ("/v1/responses", {"model": "tiny_lm", "input": "x", "text": {"format": {"type": "json_schema"}}}, "text",
         "needs its 'name'"),
        ("/tokenize", {"model": "tiny_lm"}, "prompt", "either 'prompt' or 'messages'"),
        ("/detokenize", {"model": "tiny_lm", "tokens": ["a"]}, "tokens", "Expected `int`"),
        ("/detokenize", {"model": "tiny_lm", "tokens": [2 ** 70]}, "tokens", "<= 9223372036854775807"),
    ):
        status, _, answer = post(server, body, path)
        assert status == 400, (body, answer)
        error = assert_error_shape(answer)
        assert words in error["message"] and error["param"] == param, (body, error)
    still_serves(server)
