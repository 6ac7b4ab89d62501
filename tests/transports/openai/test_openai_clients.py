"""Issue 33 through the clients people put in front of an OpenAI-compatible server, unmodified,
against a real `kernel serve` and the bundled tiny_lm (which declares tools, response_format and
logprobs): LangChain's ChatOpenAI (bind_tools, streamed tool calls, with_structured_output by JSON
schema, function calling and JSON mode) and litellm (tool calling through its openai/ and
hosted_vllm/ providers, streamed and async)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel, Field

from conftest import EXAMPLES
from openai_helpers import OpenAIServer

QUESTION = "what is the weather in Paris"


class Weather(BaseModel):
    """The weather of a city."""

    city: str = Field(description="the city")
    days: int = Field(description="how many days")


def get_weather(city: str, days: int = 1) -> str:
    """The weather of a city for some days."""
    return "sunny"


@pytest.fixture(scope="module")
def server():
    k = OpenAIServer([EXAMPLES])
    try:
        yield k.wait_ready()
    finally:
        k.stop()


@pytest.fixture(scope="module")
def llm(server):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model="tiny_lm", base_url=server.base_url, api_key="unused", max_retries=0, timeout=60,
                      max_tokens=60)


def test_langchain_bind_tools_invoke_and_stream(llm):
    with_tools = llm.bind_tools([get_weather])
    message = with_tools.invoke(QUESTION)
    (call,) = message.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "days"} and call["id"]
    assert message.response_metadata["finish_reason"] == "tool_calls"
    chunks = list(with_tools.stream(QUESTION))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert [c["name"] for c in whole.tool_calls] == ["get_weather"]
    forced = llm.bind_tools([get_weather, Weather], tool_choice="Weather").invoke(QUESTION)
    assert forced.tool_calls[0]["name"] == "Weather"


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output(llm, method):
    structured = llm.with_structured_output(Weather, method=method)
    prompt = QUESTION if method != "json_mode" else QUESTION + " (answer in JSON)"
    if method == "json_mode":  # JSON mode asks for no schema: tiny_lm answers {"answer": ...}
        raw = llm.with_structured_output(None, method="json_mode").invoke(prompt)
        assert set(raw) == {"answer"}
        return
    result = structured.invoke(prompt)
    assert isinstance(result, Weather) and result.city and isinstance(result.days, int)


def test_litellm_tool_calling(server, monkeypatch):
    # litellm fetches its model price list from the internet at import unless told to use its own copy.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": Weather.model_json_schema()}}]
    for provider in ("openai", "hosted_vllm"):
        response = litellm.completion(model=f"{provider}/tiny_lm", api_base=server.base_url, api_key="unused",
                                      messages=[{"role": "user", "content": QUESTION}], tools=tools, max_tokens=40)
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls", provider
        assert choice.message.tool_calls[0].function.name == "get_weather"
        assert set(json.loads(choice.message.tool_calls[0].function.arguments)) == {"city", "days"}
    stream = litellm.completion(model="openai/tiny_lm", api_base=server.base_url, api_key="unused", stream=True,
                                messages=[{"role": "user", "content": QUESTION}], tools=tools, max_tokens=40)
    names = [d.function.name for chunk in stream for d in (chunk.choices[0].delta.tool_calls or [])
             if d.function.name]
    assert names == ["get_weather"]

    async def call():
        return await litellm.acompletion(model="openai/tiny_lm", api_base=server.base_url, api_key="unused",
                                         messages=[{"role": "user", "content": QUESTION}], tools=tools)

    assert asyncio.run(call()).choices[0].message.tool_calls[0].function.name == "get_weather"
