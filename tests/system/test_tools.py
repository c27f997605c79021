"""Function calling end to end: the official ``openai`` client runs its tool loops on chat
completions and the Responses API, streamed and not; a Responses stream resumed after any event
replays exactly what followed.

The ``demo_only`` tests need the words of the model that calls tools on cue
(``tests.tool_model``): its calls under ``auto``, its two calls after text, its answer. The
``both_models`` ones (here and in ``test_forced_tools.py``) force one call (a named
``tool_choice``, ``parallel_tool_calls`` false) on ``served_model`` (demo, or SmolLM2 under
`make test-real-model`) and check what holds for any model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
import requests

from tests.faultstack import FaultStack
from tests.tool_model import ANSWER_TEXT
from web.common.tools.calls import ParsedAnswer, parse_answer
from web.common.tools.hermes import HermesParser

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME: Any = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object"}},
}
RESPONSES_WEATHER: Any = {"type": "function", **WEATHER["function"]}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
# One forced call, greedy: SmolLM2 repeats a forced call when more are allowed (docs/models.md).
ONE_CALL: Any = {
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "parallel_tool_calls": False,
    "temperature": 0,
    "max_tokens": 64,
}
ONE_RESPONSES_CALL: Any = {
    "tool_choice": {"type": "function", "name": "get_weather"},
    "parallel_tool_calls": False,
    "temperature": 0,
    "max_output_tokens": 64,
}


@pytest.fixture(scope="module")
def client(tool_stack: FaultStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tool_stack.web_url}/v1", api_key="x", max_retries=0)


def city_of(arguments: str) -> str:
    """The ``city`` of get_weather's arguments, which must fit its schema (a string ``city``
    required; other properties allowed, as the schema does not forbid them)."""
    parsed = json.loads(arguments)
    assert isinstance(parsed, dict) and isinstance(parsed.get("city"), str), arguments
    return str(parsed["city"])


# demo_only: the tool model's own call under auto (Paris) and its scripted answer.
@pytest.mark.demo_only
def test_the_openai_clients_chat_tool_loop(client: openai.OpenAI, tool_stack: FaultStack) -> None:
    messages: list[Any] = list(ASK)
    first = client.chat.completions.create(
        model="tools",
        messages=messages,
        tools=[WEATHER],
        temperature=0,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The job keeps the model's raw text: the calls are read from it on the web side.
    job_id = (first.model_extra or {})["job_ids"][0]
    job = requests.get(f"{tool_stack.web_url}/v1/jobs/{job_id}", timeout=10).json()
    assert job["output"].startswith("<tool_call>") and "get_weather" in job["output"]

    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 22C"})
    final = client.chat.completions.create(
        model="tools",
        messages=messages,
        tools=[WEATHER],
        temperature=0,
    )
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == ANSWER_TEXT
    assert not final.choices[0].message.tool_calls


def stored_answer(stack: FaultStack, job_id: str) -> ParsedAnswer:
    """The answer as the web tier reads it from the job's stored raw text."""
    job = requests.get(f"{stack.web_url}/v1/jobs/{job_id}", timeout=10).json()
    return parse_answer(HermesParser(), job["output"])


def stream_chat(
    client: openai.OpenAI, model: str, jobs: list[str] | None = None, **args: Any
) -> tuple[str, dict[int, dict[str, Any]], Any]:
    """The streamed content, the calls by index (name, id, argument fragments), the reason;
    the answer's job ids go into ``jobs``."""
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    reason = None
    for chunk in client.chat.completions.create(model=model, stream=True, **args):
        if jobs is not None and not jobs:
            jobs += (chunk.model_extra or {})["job_ids"]
        for choice in chunk.choices:
            delta = choice.delta
            assert "<" not in (delta.content or "")  # never a tag, whole or partial, as text
            content += delta.content or ""
            for call in delta.tool_calls or []:
                seen = calls.setdefault(call.index, {"names": [], "ids": [], "fragments": []})
                if call.function and call.function.name:
                    seen["names"].append(call.function.name)
                if call.id:
                    seen["ids"].append(call.id)
                if call.function and call.function.arguments:
                    seen["fragments"].append(call.function.arguments)
            reason = choice.finish_reason or reason
    return content, calls, reason


# demo_only: the tool model's two calls after its text ("Checking:") under auto.
@pytest.mark.demo_only
def test_two_calls_with_text_streamed_and_not(client: openai.OpenAI) -> None:
    args: Any = {
        "messages": [{"role": "user", "content": "The weather in two cities?"}],
        "tools": [WEATHER, TIME],
    }
    whole = client.chat.completions.create(model="tools", **args).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content == "Checking:"
    names = [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
    assert names == [("get_weather", {"city": "Oslo"}), ("get_time", {"zone": "CET"})]
    content, calls, reason = stream_chat(client, "tools", None, **args)
    assert (content, reason, sorted(calls)) == ("Checking:", "tool_calls", [0, 1])
    assert [calls[i]["names"] for i in (0, 1)] == [["get_weather"], ["get_time"]]
    ids = [*calls[0]["ids"], *calls[1]["ids"]]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    single = client.chat.completions.create(model="tools", parallel_tool_calls=False, **args)
    assert [c.function.name for c in single.choices[0].message.tool_calls] == ["get_weather"]


# demo_only: the tool model writes its call's tag even under none; that text must stay text.
@pytest.mark.demo_only
def test_tool_choice_none_leaves_the_answer_as_text(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="tools",
        messages=ASK,
        tools=[WEATHER],
        tool_choice="none",
    ).choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls
    assert str(answer.message.content).startswith("<tool_call>")


# demo_only: the tool model's own call under auto (Paris) and its scripted answer.
@pytest.mark.demo_only
def test_the_openai_clients_responses_tool_loop(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="tools", input="Weather in Paris?", tools=[RESPONSES_WEATHER]
    )
    assert first.status == "completed"
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and str(call.id).startswith("fc_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert [getattr(tool, "name", None) for tool in first.tools] == ["get_weather"]
    final = client.responses.create(
        model="tools",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[RESPONSES_WEATHER],
    )
    assert final.status == "completed" and final.output_text == ANSWER_TEXT
    # The whole conversation sent again instead of previous_response_id gives the same answer.
    again = client.responses.create(
        model="tools",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=[RESPONSES_WEATHER],
    )
    assert again.output_text == ANSWER_TEXT


def sse_events(response: requests.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith(b"data: ")]


@pytest.mark.parametrize(
    "forced",
    [
        # demo_only: the tool model's text and two calls under auto.
        pytest.param(False, marks=pytest.mark.demo_only, id="tool-model"),
        pytest.param(True, marks=pytest.mark.both_models, id="served-model"),
    ],
)
def test_a_responses_stream_of_calls_resumes_exactly(
    tool_stack: FaultStack, served_model: str, forced: bool
) -> None:
    base = tool_stack.web_url
    body: dict[str, Any] = {
        "model": "tools",
        "input": "The weather in two cities?",
        "tools": [RESPONSES_WEATHER, {"type": "function", "name": "get_time"}],
        "stream": True,
        "background": True,
    }
    if forced:
        body |= {"model": served_model, "input": "Weather in Paris?", **ONE_RESPONSES_CALL}
    with requests.post(f"{base}/v1/responses", json=body, stream=True, timeout=60) as response:
        assert response.status_code == 200, response.text
        events = sse_events(response)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    final = events[-1]["response"]
    if forced:
        assert [item["type"] for item in final["output"]] == ["function_call"]
        city_of(final["output"][0]["arguments"])
    else:
        assert [item["type"] for item in final["output"]] == [
            "message",
            "function_call",
            "function_call",
        ]
        assert final["output"][0]["content"][0]["text"] == "Checking:"
    for index, item in enumerate(final["output"]):
        if item["type"] != "function_call":
            continue
        deltas = [
            e["delta"]
            for e in events
            if e["type"] == "response.function_call_arguments.delta" and e["output_index"] == index
        ]
        (done,) = [
            e
            for e in events
            if e["type"] == "response.function_call_arguments.done" and e["output_index"] == index
        ]
        assert "".join(deltas) == done["arguments"] == item["arguments"]
    stored = requests.get(f"{base}/v1/responses/{final['id']}", timeout=10).json()
    assert stored["output"] == final["output"]
    for after in range(len(events)):
        url = f"{base}/v1/responses/{final['id']}?stream=true&starting_after={after}"
        with requests.get(url, stream=True, timeout=60) as replay:
            assert sse_events(replay) == events[after + 1 :], after
    past = requests.get(
        f"{base}/v1/responses/{final['id']}?stream=true&starting_after={len(events)}", timeout=10
    )
    assert past.status_code == 400


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
        ),
        ({"tool_choice": {"type": "function", "function": {"name": "absent"}}}, "tool_choice"),
        ({"tool_choice": "required", "ignore_eos": True}, "ignore_eos"),
        (  # a strict schema constrained decoding cannot keep (under auto as under required)
            {
                "tools": [
                    {
                        **WEATHER,
                        "function": {
                            **WEATHER["function"],
                            "strict": True,
                            "parameters": {"type": "object", "not": {}},
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
    ],
)
@pytest.mark.both_models
def test_bad_tools_are_400s_that_name_the_field(
    tool_stack: FaultStack, served_model: str, change: dict[str, Any], param: str
) -> None:
    body = {"model": served_model, "messages": ASK, "tools": [WEATHER], **change}
    response = requests.post(f"{tool_stack.web_url}/v1/chat/completions", json=body, timeout=10)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


# demo_only: the tool model's call under auto, and its text and two calls.
@pytest.mark.demo_only
def test_the_openai_clients_stream_helpers_assemble_the_calls(client: openai.OpenAI) -> None:
    """The client's own accumulators check every event's place (an argument delta before its
    item was added would raise), and assemble the same answer as the plain request."""
    with client.chat.completions.stream(
        model="tools", messages=ASK, tools=[WEATHER], temperature=0
    ) as stream:
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    with client.responses.stream(
        model="tools",
        input="The weather in two cities?",
        tools=[RESPONSES_WEATHER, {"type": "function", "name": "get_time"}],  # type: ignore[list-item]
    ) as events:
        response = events.get_final_response()
    assert [item.type for item in response.output] == ["message", "function_call", "function_call"]
    assert response.output_text == "Checking:"
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {"zone": "CET"}),
    ]


# demo_only: the tool model's call under auto; test_agent_sdk.py forces one on the served model.
@pytest.mark.demo_only
def test_an_agent_sdk_runs_a_function_tool_over_the_responses_api(tool_stack: FaultStack) -> None:
    """OpenAI's Agents SDK, unchanged, streamed and not: the model calls the tool, the SDK runs
    it and sends the result back, the model answers. Its tools are ``strict`` by default, with
    no ``tool_choice``: a call the model opens is held to the schema, text stays text."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return "sunny, 22C"

    async def run() -> tuple[Any, Any]:
        # Closed inside the loop: its pooled connections must not outlive the loop they use.
        async with openai.AsyncOpenAI(
            base_url=f"{tool_stack.web_url}/v1", api_key="x", max_retries=0
        ) as client:
            model = OpenAIResponsesModel(model="tools", openai_client=client)
            agent = Agent(
                name="weather", instructions="Be brief.", tools=[get_weather], model=model
            )
            plain = await Runner.run(agent, "Weather in Paris?")
            streamed = Runner.run_streamed(agent, "Weather in Paris?")
            async for _event in streamed.stream_events():
                pass
        return plain.final_output, streamed.final_output

    plain, streamed = asyncio.run(run())
    assert plain == streamed == ANSWER_TEXT
    assert cities == ["Paris", "Paris"]
