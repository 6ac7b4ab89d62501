"""Issue 33, through the official `openai` client against a real `kernel serve`: tools, the older
functions, response_format (and `.parse()`), logprobs reach a model that declares them and are
refused with a 400 naming the field otherwise (they were dropped: 200 with plain text, `logprobs:
null`); what the chat template sees (tools, tool_calls with arguments as objects, tool messages,
add_generation_prompt, chat_template_kwargs); finish_reason; the Responses API (create, stream,
parse); /tokenize and /detokenize; /health and /ping; --openai-api-key."""

from __future__ import annotations

import json
import os
import shutil

import openai
import pytest
from pydantic import BaseModel

from conftest import EXAMPLES, running
from openai_helpers import OPENAI_MODELS, OpenAIServer, assert_error_shape, request, tiny_lm

HI = [{"role": "user", "content": "what is the weather in Paris"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}
TEMPLATE = (  # trim_blocks eats a newline after a block tag: each line ends with an explicit one
    "{% for m in messages %}[{{ m.role }}]{{ m.content if m.content is not none else '' }}"
    "{% for c in m.tool_calls or [] %}<call {{ c.id }} {{ c.function.name }} city={{ c.function.arguments.city }}>"
    "{% endfor %}{% if m.tool_call_id %}<result of {{ m.tool_call_id }}>{% endif %}{{ NL }}{% endfor %}"
    "{% if tools is defined %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}{{ NL }}{% endif %}"
    "{% if style is defined %}style: {{ style }}{{ NL }}{% endif %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}").replace("{{ NL }}", "{{ '\\n' }}")


class Weather(BaseModel):
    city: str
    days: int


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """tiny_lm as bundled; plain_lm: tiny_lm declaring nothing beyond text; template_lm: the inspect
    model (answers with what reached it) with the template above."""
    root = tmp_path_factory.mktemp("features")
    shutil.copytree(EXAMPLES / "tiny_lm", root / "tiny_lm")
    plain = tiny_lm(root, "plain_lm")
    config = plain / "config.pbtxt"
    config.write_text("\n".join(line for line in config.read_text().splitlines()
                                if "openai_supports" not in line and "tokenizer_model" not in line) + "\n")
    shutil.copytree(OPENAI_MODELS / "inspect_lm", root / "template_lm")
    config = root / "template_lm" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "inspect_lm"', 'name: "template_lm"'))
    (root / "template_lm" / "tokenizer_config.json").unlink()
    (root / "template_lm" / "chat_template.jinja").write_text(TEMPLATE)
    return root


@pytest.fixture(scope="module")
def server(repo):
    yield from running(OpenAIServer([repo]))


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


# ---- tools ------------------------------------------------------------------------------------------


def test_tool_calls_come_back_as_openai_tool_calls(client):
    answer = client.chat.completions.create(model="tiny_lm", messages=HI, tools=[WEATHER, TIME], seed=1)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "days", "unit"} and arguments["unit"] == "c"
    again = client.chat.completions.create(model="tiny_lm", messages=HI, tools=[WEATHER, TIME], seed=1)
    assert again.choices[0].message.tool_calls[0].function.arguments == call.function.arguments
    named = client.chat.completions.create(model="tiny_lm", messages=HI, tools=[WEATHER, TIME],
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert named.choices[0].message.tool_calls[0].function.name == "get_time"
    words = client.chat.completions.create(model="tiny_lm", messages=HI, tools=[WEATHER], tool_choice="none",
                                           max_tokens=4)
    assert words.choices[0].message.tool_calls is None and words.choices[0].finish_reason == "length"


def test_tool_calls_stream_as_deltas_and_the_stream_helper_collects_them(client):
    chunks = list(client.chat.completions.create(model="tiny_lm", messages=HI, tools=[WEATHER], stream=True))
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and deltas[0].index == 0 and deltas[0].function.name == "get_weather"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    with client.chat.completions.stream(model="tiny_lm", messages=HI, tools=[WEATHER]) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert json.loads(final.choices[0].message.tool_calls[0].function.arguments)["city"]


def test_a_tool_result_in_the_conversation_is_answered_in_words(client):
    first = client.chat.completions.create(model="tiny_lm", messages=HI, tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]
    follow = HI + [first.choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    answer = client.chat.completions.create(model="tiny_lm", messages=follow, tools=[WEATHER], max_tokens=5)
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content


def test_the_older_functions_are_answered_as_a_function_call(client):
    answer = client.chat.completions.create(model="tiny_lm", messages=HI, functions=[WEATHER["function"]],
                                            function_call={"name": "get_weather"})
    choice = answer.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.function_call.name == "get_weather"
    assert choice.message.tool_calls is None


# ---- response_format, logprobs ----------------------------------------------------------------------


def test_parse_fills_a_pydantic_model_and_json_mode_answers_json(client):
    parsed = client.chat.completions.parse(model="tiny_lm", messages=HI, response_format=Weather, max_tokens=50)
    assert parsed.choices[0].finish_reason == "stop"
    assert isinstance(parsed.choices[0].message.parsed, Weather)
    answer = client.chat.completions.create(model="tiny_lm", messages=HI, response_format={"type": "json_object"},
                                            max_tokens=50)
    assert set(json.loads(answer.choices[0].message.content)) == {"answer"}
    # Cut at max_tokens, as a real model's JSON is: .parse() then raises the client's own error.
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model="tiny_lm", messages=HI, response_format=Weather, max_tokens=2)


def test_logprobs_come_back_in_openai_shapes(client):
    answer = client.chat.completions.create(model="tiny_lm", messages=HI, logprobs=True, top_logprobs=3,
                                            max_tokens=4, seed=2)
    content = answer.choices[0].logprobs.content
    assert len(content) == 4 and "".join(t.token for t in content) == answer.choices[0].message.content
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode()) for t in content)
    chunks = list(client.chat.completions.create(model="tiny_lm", messages=HI, logprobs=True, max_tokens=3,
                                                 seed=2, stream=True))
    assert [t.token for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content] == \
        [t.token for t in content[:3]]
    text = client.completions.create(model="tiny_lm", prompt="the cat", logprobs=2, max_tokens=3, seed=2)
    lp = text.choices[0].logprobs
    assert len(lp.tokens) == 3 and len(lp.token_logprobs) == 3 and all(len(t) == 2 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])


@pytest.mark.parametrize("fields, param", [
    ({"tools": [WEATHER]}, "tools"),
    ({"functions": [WEATHER["function"]]}, "functions"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True}, "logprobs"),
])
def test_a_model_that_declares_nothing_refuses_each_field_by_name(server, fields, param):
    status, _, body = request(server.openai_port, "POST", "/v1/chat/completions",
                              {"model": "plain_lm", "messages": HI, **fields})
    assert status == 400, body
    error = assert_error_shape(body)
    assert error["param"] == param and "openai_supports" in error["message"] and "plain_lm" in error["message"]


def test_text_response_format_and_logprobs_false_ask_nothing(client):
    answer = client.chat.completions.create(model="plain_lm", messages=HI, response_format={"type": "text"},
                                            logprobs=False, max_tokens=3)
    assert answer.choices[0].finish_reason == "length" and answer.choices[0].logprobs is None


def test_platform_fields_that_ask_for_more_are_refused(server):
    for fields, param in (({"store": True}, "store"), ({"metadata": {"a": "b"}}, "metadata"),
                          ({"service_tier": "flex"}, "service_tier"), ({"audio": {"voice": "x"}}, "audio"),
                          ({"modalities": ["text", "audio"]}, "modalities")):
        status, _, body = request(server.openai_port, "POST", "/v1/chat/completions",
                                  {"model": "tiny_lm", "messages": HI, **fields})
        assert status == 400 and assert_error_shape(body)["param"] == param, body
    status, _, body = request(server.openai_port, "POST", "/v1/chat/completions",
                              {"model": "tiny_lm", "messages": HI, "store": False, "service_tier": "auto",
                               "user": "u1", "max_tokens": 2})
    assert status == 200, body


# ---- the chat template ------------------------------------------------------------------------------


def test_the_template_sees_tools_tool_calls_tool_messages_and_its_kwargs(client):
    messages = HI + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    answer = client.chat.completions.create(model="template_lm", messages=messages, tools=[WEATHER, TIME],
                                            extra_body={"chat_template_kwargs": {"style": "brief"}})
    prompt = json.loads(answer.choices[0].message.content)["prompt"]
    assert prompt == ("[user]what is the weather in Paris\n[assistant]<call call_1 get_weather city=Paris>\n"
                      "[tool]sunny<result of call_1>\ntools: get_weather get_time\nstyle: brief\n[assistant]")
    seen = json.loads(client.chat.completions.create(
        model="template_lm", messages=HI, extra_body={"add_generation_prompt": False}).choices[0].message.content)
    assert seen["prompt"] == "[user]what is the weather in Paris\n"
    assert "add_generation_prompt" not in seen["sampling"] and "chat_template_kwargs" not in seen["sampling"]


def test_delivered_fields_reach_the_model_in_sampling_parameters(client):
    seen = json.loads(client.chat.completions.create(
        model="template_lm", messages=HI, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
        response_format={"type": "json_object"}).choices[0].message.content)["sampling"]
    assert seen["tools"] == [WEATHER] and seen["tool_choice"] == "required" and seen["parallel_tool_calls"] is False
    assert seen["response_format"] == {"type": "json_object"}
    seen = json.loads(client.chat.completions.create(
        model="template_lm", messages=HI, functions=[WEATHER["function"]],
        function_call={"name": "get_weather"}).choices[0].message.content)["sampling"]
    assert seen["tools"] == [WEATHER] and seen["tool_choice"] == {"type": "function",
                                                                    "function": {"name": "get_weather"}}


# ---- the Responses API ------------------------------------------------------------------------------


def test_responses_create_with_text_and_message_input(client):
    r = client.responses.create(model="tiny_lm", input="tell me about the river", max_output_tokens=5,
                                extra_body={"seed": 1})
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert len(r.output_text.split()) == 5 and r.usage.output_tokens == 5
    r = client.responses.create(model="tiny_lm", instructions="be brief", max_output_tokens=200,
                                input=[{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
                                extra_body={"stop": [" the"], "seed": 4})
    assert r.status == "completed" and r.output[0].type == "message" and r.output_text


def test_responses_tools_round_trip(client):
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    r = client.responses.create(model="tiny_lm", input="weather in Paris?", tools=[tool])
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments)["city"]
    r = client.responses.create(model="tiny_lm", tools=[tool], max_output_tokens=3, input=[
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert r.output[0].type == "message" and r.output_text


def test_responses_stream_typed_events(client):
    with client.responses.stream(model="tiny_lm", input="hello", max_output_tokens=300,
                                 extra_body={"stop": [" the"], "seed": 3}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}
    with client.responses.stream(model="tiny_lm", input="hi", tools=[tool]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds and json.loads(final.output[0].arguments) == {"x": 1}


def test_responses_parse_and_refusals(server, client):
    parsed = client.responses.parse(model="tiny_lm", input="weather?", text_format=Weather, max_output_tokens=60)
    assert isinstance(parsed.output_parsed, Weather)
    for fields, param in (({"previous_response_id": "resp_1"}, "previous_response_id"),
                          ({"tools": [{"type": "web_search"}]}, "tools"), ({"include": ["x"]}, "include"),
                          ({"model": "plain_lm", "text": {"format": {"type": "json_object"}}}, "text"),
                          ({"input": [{"type": "input_image"}]}, "input")):
        status, _, body = request(server.openai_port, "POST", "/v1/responses",
                                  {"model": "tiny_lm", "input": "hi", **fields})
        assert status == 400 and assert_error_shape(body)["param"] == param, (fields, body)


# ---- tokenizer, health, the API key -----------------------------------------------------------------


def test_tokenize_and_detokenize(server):
    status, _, body = request(server.openai_port, "POST", "/tokenize", {"model": "tiny_lm", "prompt": "the cat zzz"})
    doc = json.loads(body)
    assert status == 200 and doc["count"] == 3 and doc["tokens"][2] == 0 and doc["max_model_len"] == 4096
    status, _, body = request(server.openai_port, "POST", "/detokenize", {"model": "tiny_lm", "tokens": doc["tokens"]})
    assert status == 200 and json.loads(body) == {"prompt": "the cat <unk>"}
    status, _, body = request(server.openai_port, "POST", "/tokenize",
                              {"model": "tiny_lm", "messages": [{"role": "user", "content": "the cat"}]})
    assert json.loads(body)["count"] == len("user: the cat\nassistant:".split())
    status, _, body = request(server.openai_port, "POST", "/tokenize", {"model": "plain_lm", "prompt": "x"})
    assert status == 404 and "plain_lm" in assert_error_shape(body)["message"]


def test_health_and_ping_on_the_openai_port(server):
    for path in ("/health", "/ping", "/health/ready"):
        status, _, body = request(server.openai_port, "GET", path)
        assert (status, json.loads(body)) == (200, {"ready": True})


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_an_api_key_is_asked_for_on_every_route_but_health(repo, how):
    extra = ("--openai-api-key", "s3cret") if how == "flag" else ()
    env = dict(os.environ, KERNEL_OPENAI_API_KEY="s3cret") if how == "environment" else None
    k = OpenAIServer([repo], *extra, env=env)
    try:
        k.wait_ready()
        with pytest.raises(openai.AuthenticationError) as err:
            k.client(api_key="wrong").models.list()
        assert err.value.code == "invalid_api_key"
        status, _, body = request(k.openai_port, "POST", "/v1/chat/completions", {"model": "tiny_lm", "messages": HI})
        assert status == 401 and assert_error_shape(body)["code"] == "invalid_api_key"
        assert "s3cret" not in body.decode()
        assert request(k.openai_port, "GET", "/health")[0] == 200
        answer = k.client(api_key="s3cret").chat.completions.create(model="tiny_lm", messages=HI, max_tokens=2)
        assert answer.choices[0].message.content
    finally:
        k.stop()
