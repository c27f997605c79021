"""Strict tools under ``auto``, end to end: the clients that send them by default (openai's
``pydantic_function_tool``, LangChain's ``bind_tools(strict=True)``, Anthropic's ``strict``)
run their tool loops unchanged to the final answer on the model that calls tools on cue
(``tests.tool_model``). The answer may be text; a call the model opens is held to the offered
tools (a name it was not offered becomes one it was), and a stream never shows its tag.

Those need the tool model's cue (it calls under ``auto``): they are ``demo_only``. On
``served_model`` (demo, or SmolLM2 under `make test-real-model`) a strict tool's lazy grammar
must leave the model's own answer whole: text or a call that fits, streamed as answered."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pydantic
import pytest
import requests

from tests.faultstack import FaultStack
from tests.system.test_tools import ASK, WEATHER, stored_answer, stream_chat
from tests.tool_model import ANSWER_TEXT

STRICT_WEATHER: Any = {
    **WEATHER,
    "function": {
        **WEATHER["function"],
        "strict": True,
        "parameters": {**WEATHER["function"]["parameters"], "additionalProperties": False},
    },
}


class GetWeather(pydantic.BaseModel):
    """The weather in a city."""

    city: str


@pytest.fixture(scope="module")
def client(tool_stack: FaultStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tool_stack.web_url}/v1", api_key="x", max_retries=0)


def job_grammar(stack: FaultStack, extra: dict[str, Any] | None) -> Any:
    """The grammar the answer's job carried."""
    job_id = (extra or {})["job_ids"][0]
    job = requests.get(f"{stack.web_url}/v1/jobs/{job_id}", timeout=10).json()
    return job["params"].get("grammar")


# demo_only (every test but the last): the tool model's call under auto and its answer.
@pytest.mark.demo_only
def test_pydantic_function_tools_run_the_chat_loop_under_auto(
    client: openai.OpenAI, tool_stack: FaultStack
) -> None:
    tools = [openai.pydantic_function_tool(GetWeather, name="get_weather")]
    messages: list[Any] = list(ASK)
    first = client.chat.completions.parse(
        model="tools", messages=messages, tools=tools, temperature=0
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls or []
    assert call.function.parsed_arguments == GetWeather(city="Paris")
    assert job_grammar(tool_stack, first.model_extra) is not None  # held to the schema
    function = {"name": call.function.name, "arguments": call.function.arguments}
    messages.append(
        {
            "role": "assistant",
            "tool_calls": [{"id": call.id, "type": "function", "function": function}],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 22C"})
    final = client.chat.completions.parse(model="tools", messages=messages, tools=tools)
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == ANSWER_TEXT


@pytest.mark.demo_only
def test_a_streamed_strict_call_never_shows_its_tag_and_text_stays_text(
    client: openai.OpenAI,
) -> None:
    content, calls, reason = stream_chat(
        client, "tools", None, messages=ASK, tools=[STRICT_WEATHER], temperature=0
    )
    assert (content, reason) == ("", "tool_calls")
    assert calls[0]["names"] == ["get_weather"]
    assert json.loads("".join(calls[0]["fragments"])) == {"city": "Paris"}
    # Text and two calls (the second tool not strict): the text streams as it is.
    time_tool = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    content, calls, reason = stream_chat(
        client,
        "tools",
        None,
        messages=[{"role": "user", "content": "two?"}],
        tools=[STRICT_WEATHER, time_tool],
        temperature=0,
    )
    assert content == "Checking:" and reason == "tool_calls"
    assert [calls[i]["names"] for i in sorted(calls)] == [["get_weather"], ["get_time"]]


@pytest.mark.demo_only
def test_a_call_the_model_opens_names_only_an_offered_tool(client: openai.OpenAI) -> None:
    """The model writes ``get_weather``; only ``get_forecast`` is offered: the call is one."""
    forecast: Any = {
        "type": "function",
        "function": {**STRICT_WEATHER["function"], "name": "get_forecast"},
    }
    answer = client.chat.completions.create(
        model="tools", messages=ASK, tools=[forecast], temperature=0, max_tokens=64
    )
    choice = answer.choices[0]
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_forecast"
    assert set(json.loads(call.function.arguments)) == {"city"}
    assert choice.finish_reason in ("tool_calls", "length")


@pytest.mark.demo_only
def test_langchain_bound_strict_tools_run_under_auto(tool_stack: FaultStack) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny, 22C"

    llm = ChatOpenAI(
        model="tools",
        base_url=f"{tool_stack.web_url}/v1",
        api_key="not-needed",  # type: ignore[arg-type]
        temperature=0,
        max_retries=0,
    ).bind_tools([get_weather], strict=True)
    history: list[Any] = [HumanMessage("What is the weather in Paris?")]
    first = llm.invoke(history)
    (call,) = getattr(first, "tool_calls", [])
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"})
    history += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    final = llm.invoke(history)
    assert final.content == ANSWER_TEXT and not getattr(final, "tool_calls", [])


@pytest.mark.demo_only
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_an_anthropic_auto_loop_with_a_strict_tool(tool_stack: FaultStack, streamed: bool) -> None:
    client = anthropic.Anthropic(base_url=tool_stack.web_url, api_key="x", max_retries=0)
    tool: Any = {
        "name": "get_weather",
        "input_schema": WEATHER["function"]["parameters"],
        "strict": True,
    }
    args: Any = {
        "model": "tools",
        "max_tokens": 32,
        "tools": [tool],
        "tool_choice": {"type": "auto"},
        "extra_body": {"temperature": 0},
    }

    def create(messages: list[Any]) -> Any:
        if not streamed:
            return client.messages.create(messages=messages, **args)
        with client.messages.stream(messages=messages, **args) as stream:
            return stream.get_final_message()

    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = create(messages)
    assert first.stop_reason == "tool_use"
    (use,) = first.content
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    messages.append({"role": "assistant", "content": first.content})
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 22C"}
    messages.append({"role": "user", "content": [result]})
    final = create(messages)
    assert final.stop_reason == "end_turn" and final.content[0].text == ANSWER_TEXT


@pytest.mark.both_models
def test_a_strict_tool_under_auto_leaves_the_served_models_answer_whole(
    client: openai.OpenAI, tool_stack: FaultStack, served_model: str
) -> None:
    """Whatever the model answers, text or a call, the lazy grammar held it (a call fits its
    schema), and the stream (never a tag as text) equals what its job stored."""
    tools = [openai.pydantic_function_tool(GetWeather, name="get_weather")]
    args: Any = {"messages": ASK, "tools": tools, "temperature": 0, "max_tokens": 32}
    whole = client.chat.completions.parse(model=served_model, **args)
    assert job_grammar(tool_stack, whole.model_extra) is not None  # held to the schema
    for call in whole.choices[0].message.tool_calls or []:
        assert isinstance(call.function.parsed_arguments, GetWeather)
    jobs: list[str] = []
    content, calls, reason = stream_chat(client, served_model, jobs, **args)
    stored = stored_answer(tool_stack, jobs[0])
    assert content == stored.content and reason in ("stop", "length", "tool_calls")
    streamed = [(seen["names"], "".join(seen["fragments"])) for _, seen in sorted(calls.items())]
    assert streamed == [([call.name], call.arguments) for call in stored.calls]
