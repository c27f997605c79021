"""Structured output and forced tool calls against the real stack (web, worker, CTranslate2 on
``served_model``: demo, or SmolLM2 under `make test-real-model`): the official clients' ``parse``
helpers and LangChain get answers that parse and validate, a forced call's arguments match its
tool's schema, and a stream is the stored text. The demo model is a bigram model that knows
nothing of JSON: only the grammar makes the answers valid; on SmolLM2 the grammar reads a
Hugging Face vocabulary."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.clients import get_job
from tests.schema_answers import SHAPES, assert_valid, field_schema


class Weather(BaseModel):
    """Small enough that the demo model finishes it within its budget."""

    city: Literal["Paris", "Oslo"]
    celsius: int = Field(ge=-40, le=45)
    sunny: bool


WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
MAX_TOKENS = 96

pytestmark = pytest.mark.both_models


@pytest.fixture(scope="module")
def client(stack_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack_url}/v1", api_key="not-needed", max_retries=0)


def test_a_json_schema_answer_validates_and_streams_as_stored(
    client: openai.OpenAI, stack_url: str, served_model: str
) -> None:
    schema = {**Weather.model_json_schema(), "additionalProperties": False}
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": schema, "strict": True},
    }
    args: Any = {
        "model": served_model,
        "messages": ASK,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.8,
    }
    whole = client.chat.completions.create(response_format=response_format, seed=7, **args)
    content = whole.choices[0].message.content
    assert content is not None
    jsonschema.validate(json.loads(content), schema)
    assert content == json.dumps(json.loads(content), separators=(",", ":"))  # compact JSON
    chunks = list(
        client.chat.completions.create(response_format=response_format, stream=True, **args)
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    job = get_job(stack_url, chunks[0].id)
    assert streamed == job["output"] and job["params"]["grammar"]
    jsonschema.validate(json.loads(streamed), schema)


def test_json_object_on_chat_and_completions(client: openai.OpenAI, served_model: str) -> None:
    chat = client.chat.completions.create(
        model=served_model,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(chat.choices[0].message.content or ""), dict)
    completion = client.completions.create(
        model=served_model,
        prompt="The answer:",
        max_tokens=MAX_TOKENS,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert isinstance(json.loads(completion.choices[0].text), dict)


def test_the_clients_parse_helpers_get_their_model(
    client: openai.OpenAI, served_model: str
) -> None:
    parsed = client.chat.completions.parse(
        model=served_model,
        messages=ASK,
        max_tokens=MAX_TOKENS,
        response_format=Weather,  # type: ignore[arg-type]
    )
    weather = parsed.choices[0].message.parsed
    assert isinstance(weather, Weather)
    response = client.responses.parse(
        model=served_model,
        input="Weather in Oslo?",
        max_output_tokens=MAX_TOKENS,
        text_format=Weather,
    )
    assert isinstance(response.output_parsed, Weather)
    assert response.text.format is not None and response.text.format.type == "json_schema"


def test_a_required_call_has_arguments_its_schema_accepts(
    client: openai.OpenAI, served_model: str
) -> None:
    schema = WEATHER_TOOL["function"]["parameters"]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        result = client.chat.completions.create(
            model=served_model,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            tool_choice=choice,  # type: ignore[arg-type]
            parallel_tool_calls=False,
        )
        answer = result.choices[0]
        assert answer.finish_reason in ("tool_calls", "length"), answer
        calls = answer.message.tool_calls or []
        assert len(calls) == 1 and calls[0].function.name == "get_weather"  # type: ignore[union-attr]
        jsonschema.validate(json.loads(calls[0].function.arguments), schema)  # type: ignore[union-attr]
    response = client.responses.create(
        model=served_model,
        input="Weather?",
        max_output_tokens=MAX_TOKENS,
        tools=[{"type": "function", **WEATHER_TOOL["function"], "strict": True}],  # type: ignore[list-item]
        tool_choice="required",
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)  # type: ignore[union-attr]
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), schema)  # type: ignore[union-attr]


def test_langchain_structured_output_and_bound_tools(stack_url: str, served_model: str) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=served_model,
        base_url=f"{stack_url}/v1",
        api_key="not-needed",  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,  # type: ignore[call-arg]
        max_retries=0,
    )
    weather = llm.with_structured_output(Weather).invoke("Weather in Paris?")
    assert isinstance(weather, Weather)

    @tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather in a city."""
        return "sunny"

    message = llm.bind_tools([get_weather], tool_choice="required").invoke("Weather?")
    calls = getattr(message, "tool_calls", [])
    assert calls and calls[0]["name"] == "get_weather"
    assert calls[0]["args"]["city"] in ("Paris", "Oslo")


def test_a_streamed_forced_call_is_the_stored_call(
    client: openai.OpenAI, stack_url: str, served_model: str
) -> None:
    chunks = list(
        client.chat.completions.create(
            model=served_model,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            tool_choice="required",
            parallel_tool_calls=False,
            stream=True,
        )
    )
    names = [
        call.function.name
        for c in chunks
        if c.choices
        for call in c.choices[0].delta.tool_calls or ()
        if call.function is not None and call.function.name
    ]
    arguments = "".join(
        call.function.arguments or ""
        for c in chunks
        if c.choices
        for call in c.choices[0].delta.tool_calls or ()
        if call.function is not None
    )
    assert names == ["get_weather"]
    jsonschema.validate(json.loads(arguments), WEATHER_TOOL["function"]["parameters"])
    output = get_job(stack_url, chunks[0].id)["output"]
    assert json.loads(output.removeprefix("<tool_call>").split("</tool_call>")[0]) == {
        "name": "get_weather",
        "arguments": json.loads(arguments),
    }


def test_anthropic_any_is_a_tool_use_block_that_validates(
    stack_url: str, served_model: str
) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=stack_url, api_key="not-needed", max_retries=0)
    tool = {"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        message = client.messages.create(
            model=served_model,
            max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[tool],  # type: ignore[list-item]
            tool_choice={**choice, "disable_parallel_tool_use": True},  # type: ignore[typeddict-item]
        )
        (block,) = message.content
        assert block.type == "tool_use" and block.name == "get_weather"
        jsonschema.validate(block.input, tool["input_schema"])
        assert message.stop_reason in ("tool_use", "max_tokens")


@pytest.mark.demo_only
@pytest.mark.parametrize("shape", ["email", "date-time", "uri", "pattern"])
def test_a_format_the_model_wants_to_end_inside_is_answered_validly(
    client: openai.OpenAI, shape: str
) -> None:
    """Was a 500 (GrammarFailed: the grammar refused its own forced token) at temperature 0:
    the demo model ends inside the string, and the closing walk dead-ended there. Now every
    budget from the shortest answer up is answered, whole or cut, and the answer validates."""
    schema = field_schema(SHAPES[shape])
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "record", "schema": schema, "strict": True},
    }
    for max_tokens in (24, 60, 256):
        for temperature in (0.0, 1.0):
            answer = client.chat.completions.create(
                model="demo",
                messages=ASK,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=temperature,
                seed=max_tokens,
                response_format=response_format,
            )
            choice = answer.choices[0]
            assert choice.finish_reason in ("stop", "length")
            assert_valid(schema, choice.message.content or "")
