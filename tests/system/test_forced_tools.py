"""Forced tool calls on ``served_model`` (demo, or SmolLM2 under `make test-real-model`): the
official ``openai`` client's tool loops on chat completions and the Responses API, streamed and
not, with one call forced (a named ``tool_choice``, ``parallel_tool_calls`` false). What is
checked holds for any model: the call's shape, arguments that fit the schema, a stream that
equals what its job stored, the call and its result rendered into the next prompt."""

from __future__ import annotations

from typing import Any

import openai
import pytest
import requests

from tests.faultstack import FaultStack
from tests.system.test_tools import (
    ASK,
    ONE_CALL,
    ONE_RESPONSES_CALL,
    RESPONSES_WEATHER,
    WEATHER,
    city_of,
    stored_answer,
    stream_chat,
)
from trickle import keys

pytestmark = pytest.mark.both_models


@pytest.fixture(scope="module")
def client(tool_stack: FaultStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tool_stack.web_url}/v1", api_key="x", max_retries=0)


def test_a_forced_call_runs_the_chat_tool_loop_on_the_served_model(
    client: openai.OpenAI, tool_stack: FaultStack, served_model: str
) -> None:
    messages: list[Any] = list(ASK)
    first = client.chat.completions.create(
        model=served_model, messages=messages, tools=[WEATHER], **ONE_CALL
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    city_of(call.function.arguments)
    # The job keeps the model's raw text: the calls are read from it on the web side.
    job_id = (first.model_extra or {})["job_ids"][0]
    job = requests.get(f"{tool_stack.web_url}/v1/jobs/{job_id}", timeout=10).json()
    assert "get_weather" in job["output"]

    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 22C"})
    final = client.chat.completions.create(
        model=served_model,
        messages=messages,
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_tokens=32,
    )
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length") and not answer.message.tool_calls
    assert isinstance(answer.message.content, str)
    # The call and its result went into the prompt, through the model's own template.
    assert first.usage is not None and final.usage is not None
    assert final.usage.prompt_tokens > first.usage.prompt_tokens


def test_a_streamed_call_sends_its_name_once_then_argument_fragments(
    client: openai.OpenAI, tool_stack: FaultStack, served_model: str
) -> None:
    """The stream equals what its job stored (a second request is not compared: SmolLM2 is
    int8, and a prompt read from the prefix cache may turn its greedy answer elsewhere)."""
    args: Any = {"messages": ASK, "tools": [WEATHER], **ONE_CALL}
    jobs: list[str] = []
    content, calls, reason = stream_chat(client, served_model, jobs, **args)
    stored = stored_answer(tool_stack, jobs[0])
    assert (content, reason) == ("", "tool_calls")
    assert list(calls) == [0]
    assert calls[0]["names"] == ["get_weather"] and len(calls[0]["ids"]) == 1
    # The arguments take several tokens: they come in several fragments.
    assert len(calls[0]["fragments"]) > 1
    arguments = "".join(calls[0]["fragments"])
    city_of(arguments)
    assert [(c.name, c.arguments) for c in stored.calls] == [("get_weather", arguments)]


def test_the_served_model_takes_tools_through_its_template(
    client: openai.OpenAI, served_model: str
) -> None:
    """Demo's built-in template, SmolLM2's ``tool_chat_template``: the tool is in the prompt."""
    plain = client.chat.completions.create(model=served_model, messages=ASK, max_tokens=8)
    answer = client.chat.completions.create(
        model=served_model,
        messages=ASK,
        tools=[WEATHER],
        max_tokens=8,
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage is not None and plain.usage is not None
    assert answer.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # the tool is in it


def stored_prompt(stack: FaultStack, response_id: str) -> str:
    """The prompt the response's job was given, as the template rendered it."""
    job_id = "job_" + response_id.removeprefix("resp_")
    return str(stack.client().hget(keys.job(job_id), "prompt"))


def test_a_forced_call_runs_the_responses_tool_loop_on_the_served_model(
    client: openai.OpenAI, tool_stack: FaultStack, served_model: str
) -> None:
    first = client.responses.create(
        model=served_model,
        input="Weather in Paris?",
        tools=[RESPONSES_WEATHER],
        **ONE_RESPONSES_CALL,
    )
    assert first.status == "completed"
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and str(call.id).startswith("fc_")
    city_of(call.arguments)
    answer: Any = {"tools": [RESPONSES_WEATHER], "temperature": 0, "max_output_tokens": 24}
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    final = client.responses.create(
        model=served_model, previous_response_id=first.id, input=[result], **answer
    )
    assert final.status in ("completed", "incomplete")
    # The whole conversation sent again instead of previous_response_id is the same prompt.
    again = client.responses.create(
        model=served_model,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            result,
        ],
        **answer,
    )
    assert stored_prompt(tool_stack, again.id) == stored_prompt(tool_stack, final.id)
    assert "sunny" in stored_prompt(tool_stack, final.id)
    assert again.usage is not None and final.usage is not None
    assert again.usage.input_tokens == final.usage.input_tokens
    if served_model == "demo":  # int8 SmolLM2's greedy answer may differ (docs/models.md)
        assert again.output_text == final.output_text


def test_the_stream_helpers_assemble_a_forced_call_on_the_served_model(
    client: openai.OpenAI, tool_stack: FaultStack, served_model: str
) -> None:
    """The client's accumulators check every event's place and assemble what the job
    stored."""
    args: Any = {"model": served_model, "messages": ASK, "tools": [WEATHER], **ONE_CALL}
    jobs: list[str] = []
    with client.chat.completions.stream(**args) as stream:
        for event in stream:
            if event.type == "chunk" and not jobs:
                jobs += (event.chunk.model_extra or {})["job_ids"]
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    city_of(call.function.arguments)
    stored = stored_answer(tool_stack, jobs[0])
    assert [(c.name, c.arguments) for c in stored.calls] == [
        ("get_weather", call.function.arguments)
    ]
    with client.responses.stream(
        model=served_model,
        input="Weather in Paris?",
        tools=[RESPONSES_WEATHER],
        **ONE_RESPONSES_CALL,
    ) as events:
        response = events.get_final_response()
    (item,) = response.output
    assert item.type == "function_call" and item.name == "get_weather"
    city_of(item.arguments)
