"""The OpenAI-compatible API (kernel serve --openai-port) through the official `openai` client:
models, chat completions and completions (streamed and not, sync and async, n > 1), embeddings,
errors as the client's exception classes, what reaches the model (the vLLM tensor convention and
the chat template), restricted APIs, and a PyTriton-style bound generator."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import openai
import pytest

from conftest import EXAMPLES, free_ports
from openai_helpers import OPENAI_MODELS, OpenAIServer, assert_error_shape, request


@pytest.fixture(scope="module")
def server():
    k = OpenAIServer([EXAMPLES, OPENAI_MODELS])
    try:
        yield k.wait_ready()
    finally:
        k.stop()


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


HI = [{"role": "user", "content": "tell me about the river"}]


# ---- models ---------------------------------------------------------------------------------------


def test_models_are_listed_and_retrieved(client):
    ids = [m.id for m in client.models.list()]
    assert {"tiny_lm", "inspect_lm", "embed"} <= set(ids)
    # Only models these routes can call (issue 33: add_sub was listed and could not chat).
    assert "add_sub" not in ids and "string_identity" not in ids
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("add_sub")
    model = client.models.retrieve("tiny_lm")
    assert (model.id, model.object, model.owned_by) == ("tiny_lm", "model", "kernel")
    assert isinstance(model.created, int)
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no_such_model")
    assert err.value.code == "model_not_found"


# ---- chat completions ---------------------------------------------------------------------------------


def test_chat_stream_and_answer_agree_under_a_seed(client):
    chunks = list(client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=6, seed=7, stream=True))
    assert len(chunks) == 6  # one per word: the model streams
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].id.startswith("chatcmpl-")
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 5 + ["length"]
    streamed = "".join(c.choices[0].delta.content for c in chunks)
    answer = client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=6, seed=7)
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.model == "tiny_lm" and isinstance(answer.created, int)
    choice = answer.choices[0]
    assert (choice.index, choice.message.role, choice.finish_reason) == (0, "assistant", "length")
    assert choice.message.content == streamed and len(streamed.split()) >= 5
    assert answer.usage.completion_tokens == 6
    assert answer.usage.prompt_tokens == len("user: tell me about the river\nassistant:".split())  # the plain template
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 6
    again = client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=6, seed=7)
    assert again.choices[0].message.content == streamed


def test_stream_options_include_usage(client):
    chunks = list(client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=4, seed=1, stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == []
    assert (last.usage.completion_tokens, last.usage.total_tokens) == (4, last.usage.prompt_tokens + 4)


def test_n_choices_each_with_its_index(client):
    answer = client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=5, seed=3, n=3)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    texts = [c.message.content for c in answer.choices]
    assert len(set(texts)) == 3  # seeded choices differ from each other...
    assert answer.usage.completion_tokens == 15
    chunks = list(client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=5, seed=3, n=3,
                                                 stream=True))
    streamed = {0: "", 1: "", 2: ""}
    for c in chunks:
        for choice in c.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert [streamed[i] for i in range(3)] == texts  # ...and are the same each time


async def test_async_client_streams_and_answers(server):
    async with server.async_client() as client:
        stream = await client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=4, seed=5, stream=True)
        text = "".join([c.choices[0].delta.content async for c in stream])
        answers = await asyncio.gather(*(client.chat.completions.create(
            model="tiny_lm", messages=HI, max_tokens=4, seed=5) for _ in range(8)))
    assert {a.choices[0].message.content for a in answers} == {text}


def test_stop_strings_end_the_answer(client):
    greedy = client.completions.create(model="tiny_lm", prompt="the cat", max_tokens=8, temperature=0)
    words = greedy.choices[0].text.split()
    assert len(words) == 8
    stopped = client.completions.create(model="tiny_lm", prompt="the cat", max_tokens=8, temperature=0,
                                        stop=[" " + words[3]])
    assert stopped.choices[0].text == " " + " ".join(words[:3])
    assert stopped.choices[0].finish_reason == "stop"


def test_completions_with_prompts_n_and_echo(client):
    answer = client.completions.create(model="tiny_lm", prompt=["the cat", "a dog"], n=2, max_tokens=3, seed=2)
    assert answer.object == "text_completion" and answer.id.startswith("cmpl-")
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    assert answer.usage.prompt_tokens == 4 and answer.usage.completion_tokens == 12
    echoed = client.completions.create(model="tiny_lm", prompt="the cat", max_tokens=3, seed=2, echo=True)
    assert echoed.choices[0].text.startswith("the cat ")
    plain = client.completions.create(model="tiny_lm", prompt="the cat", max_tokens=3, seed=2)
    assert echoed.choices[0].text == "the cat" + plain.choices[0].text
    streamed = client.completions.create(model="tiny_lm", prompt="the cat", max_tokens=3, seed=2, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == plain.choices[0].text


# ---- what reaches the model ------------------------------------------------------------------------------


def test_request_fields_reach_the_model_as_sampling_parameters(client):
    answer = client.chat.completions.create(
        model="inspect_lm",
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        max_completion_tokens=12, max_tokens=99, temperature=0.5, top_p=0.9, stop=["\n"], seed=11,
        presence_penalty=0.1, frequency_penalty=-0.2, user="someone", logprobs=True, top_logprobs=2,
        extra_body={"top_k": 5, "repetition_penalty": 1.1},
    )
    seen = json.loads(answer.choices[0].message.content)
    # The model folder's chat template (tokenizer_config.json), with its bos and eos tokens.
    assert seen["prompt"] == "<s><|system|>\nbe brief</s>\n<|user|>\nhi</s>\n<|assistant|>\n"
    assert seen["sampling"] == {"max_tokens": 12, "temperature": 0.5, "top_p": 0.9, "stop": ["\n"], "seed": 11,
                                "presence_penalty": 0.1, "frequency_penalty": -0.2, "logprobs": True,
                                "top_logprobs": 2, "top_k": 5, "repetition_penalty": 1.1}
    assert (seen["stream"], seen["exclude_input_in_output"]) == (False, True)
    assert (seen["return_num_input_tokens"], seen["return_num_output_tokens"]) == (True, True)
    assert answer.usage.prompt_tokens == len(seen["prompt"].split())
    assert answer.usage.completion_tokens == len(answer.choices[0].message.content.split())
    # No finish_reason output: "length" because the model reported at least max_tokens tokens.
    assert answer.usage.completion_tokens >= 12 and answer.choices[0].finish_reason == "length"


def test_a_model_that_answers_once_streams_one_chunk(client):
    chunks = list(client.chat.completions.create(model="inspect_lm", messages=HI, stream=True))
    assert len(chunks) == 1 and chunks[0].choices[0].finish_reason == "stop"
    assert json.loads(chunks[0].choices[0].delta.content)["stream"] is True


def test_chat_template_refusal_is_a_bad_request(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="inspect_lm", messages=[{"role": "tool", "content": "x"}])
    assert "tool messages are not supported by this template" in err.value.message
    with pytest.raises(openai.BadRequestError, match="content parts of type 'image_url'"):
        client.chat.completions.create(model="inspect_lm", messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])


# ---- models that do not fit, and errors ----------------------------------------------------------------------


def test_models_that_do_not_fit_are_refused_naming_what_is_missing(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="add_sub", messages=HI)
    assert "'text_input'" in err.value.message and "'text_output'" in err.value.message
    assert err.value.code == "model_not_supported"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no_such_model", messages=HI)
    with pytest.raises(openai.BadRequestError, match="cannot serve embeddings"):
        client.embeddings.create(model="tiny_lm", input="x")
    with pytest.raises(openai.BadRequestError, match="cannot serve text generation"):
        client.completions.create(model="embed", prompt="x")


def test_the_models_own_refusal_is_a_bad_request(client):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 4096"):
        client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=5000)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 4096"):
        list(client.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=5000, stream=True))


def test_errors_in_the_openai_shape(server):
    port = server.openai_port
    status, _, body = request(port, "POST", "/v1/chat/completions", b'{"model": ')
    assert status == 400 and assert_error_shape(body)["type"] == "invalid_request_error"
    status, _, body = request(port, "GET", "/v1/nothing")
    assert status == 404 and assert_error_shape(body)["code"] == "unknown_url"
    status, _, body = request(port, "GET", "/v1/chat/completions")
    assert status == 405 and assert_error_shape(body)["message"]
    status, _, body = request(port, "POST", "/v1/chat/completions", {"model": "tiny_lm", "messages": HI, "n": "2"})
    assert status == 400 and assert_error_shape(body)["param"] == "n"
    status, _, body = request(port, "GET", "/health/ready")
    assert (status, json.loads(body)) == (200, {"ready": True})


# ---- embeddings -----------------------------------------------------------------------------------------


def test_embeddings_float_and_base64(client):
    texts = ["a b c", "hello"]
    expected = [[len(t), len(t.split()), sum(t.encode()) / 1000.0, t.encode()[0]] for t in texts]
    as_base64 = client.embeddings.create(model="embed", input=texts)  # the client asks for base64 by default
    as_float = client.embeddings.create(model="embed", input=texts, encoding_format="float")
    for answer in (as_base64, as_float):
        assert [d.index for d in answer.data] == [0, 1]
        for d, want in zip(answer.data, expected):
            np.testing.assert_allclose(d.embedding, want, rtol=1e-6)
        assert answer.usage.prompt_tokens == 4 and answer.usage.total_tokens == 4
    with pytest.raises(openai.BadRequestError, match="encoding_format"):
        client.embeddings.create(model="embed", input="x", encoding_format="int8")  # type: ignore[arg-type]


# ---- restricted APIs --------------------------------------------------------------------------------------


def test_restricted_api_groups(start_kernel):
    del start_kernel  # this test starts its own server with the restriction
    k = OpenAIServer([EXAMPLES], "--http-restricted-api", "inference:infer-key=secret")
    try:
        k.wait_ready()
        with k.client() as c:
            assert "tiny_lm" in [m.id for m in c.models.list()]  # model-repository: not restricted here
            with pytest.raises(openai.AuthenticationError) as err:
                c.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=2)
            assert "infer-key" in err.value.message and err.value.code == "invalid_auth"
        with k.client(default_headers={"infer-key": "secret"}) as c:
            assert c.chat.completions.create(model="tiny_lm", messages=HI, max_tokens=2).choices[0].message.content
    finally:
        k.stop()


# ---- a PyTriton-style bound generator ------------------------------------------------------------------------


def test_bound_generator_answers_chat_completions(tmp_path):
    from openai import OpenAI

    from kernel.model_config import ModelConfig, Tensor
    from kernel.triton import Triton, TritonConfig

    def words(requests):
        """One word per response, as many as the request's max_tokens parameter asks (default 3)."""
        request = requests[0]
        prompt = request["text_input"].reshape(-1)[0].decode()
        count = int(request.parameters.get("max_tokens", 3))
        for i in range(count):
            yield [{"text_output": np.array([f" {prompt.split()[-1]}{i}".encode()], dtype=np.object_)}]

    def split_character(requests):
        """'café ☕' with each multi-byte character split across two responses."""
        for piece in (b"caf\xc3", b"\xa9 \xe2\x98", b"\x95"):
            yield [{"text_output": np.array([piece], dtype=np.object_)}]

    http, grpc, metrics, port = free_ports(4)
    config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics, openai_port=port)
    with Triton(config=config, workspace=tmp_path / "ws") as triton:
        triton.bind("words", words, [Tensor(name="text_input", dtype=bytes, shape=(1,))],
                    [Tensor(name="text_output", dtype=bytes, shape=(1,))],
                    config=ModelConfig(batching=False, decoupled=True))
        with OpenAI(base_url=f"http://localhost:{port}/v1", api_key="unused", max_retries=0) as client:
            chunks = list(client.chat.completions.create(model="words", messages=HI, max_tokens=4, stream=True))
            # The generator's words, then the end of its stream: an empty delta with the finish reason.
            assert [c.choices[0].delta.content for c in chunks] == [" assistant:0", " assistant:1", " assistant:2",
                                                                    " assistant:3", None]
            # No token counts: its 4 pieces of text reached max_tokens, so "length" (was "stop", issue 33).
            assert [c.choices[0].finish_reason for c in chunks] == [None] * 4 + ["length"]
            answer = client.chat.completions.create(model="words", messages=HI)
            assert answer.choices[0].message.content == " assistant:0 assistant:1 assistant:2"
            assert answer.usage is None  # the callable reports no token counts
            assert answer.choices[0].finish_reason == "stop"  # 3 pieces, no max_tokens
            answer = client.chat.completions.create(model="words", messages=HI, max_tokens=5)
            assert answer.choices[0].finish_reason == "length"
        triton.bind("split", split_character, [Tensor(name="text_input", dtype=bytes, shape=(1,))],
                    [Tensor(name="text_output", dtype=bytes, shape=(1,))],
                    config=ModelConfig(batching=False, decoupled=True))
        with OpenAI(base_url=f"http://localhost:{port}/v1", api_key="unused", max_retries=0) as client:
            chunks = list(client.chat.completions.create(model="split", messages=HI, stream=True))
            assert [c.choices[0].delta.content for c in chunks] == ["caf", "é ", "☕", None]
            assert client.chat.completions.create(model="split", messages=HI).choices[0].message.content == "café ☕"
