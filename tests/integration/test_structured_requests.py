"""Structured output and forced tool calls in process on a real Redis: what cannot be enforced
is a 400 naming the field (and the JSON Schema keyword) before any job exists; what can is a
job whose parameters carry the grammar, and its answer, driven by hand as a worker would write
it, reads as tool calls on every route (``finish_reason`` ``length`` when cut)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask

from tests.faultstack import wait_for
from tests.integration.test_messages_tools import drive
from tests.messages_client import store_of
from trickle import keys
from trickle.config.settings import Settings
from trickle.jobs import FinishReason, Job

ASK = [{"role": "user", "content": "Weather?"}]
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
FLAT_TOOL = {"type": "function", "name": "get_weather", "parameters": PARAMETERS}
MESSAGES_TOOL = {"name": "get_weather", "input_schema": PARAMETERS}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
UNENFORCEABLE = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
CALL = '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo"}}</tool_call>'


@pytest.fixture(scope="module")
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Flask:
    return make_app(settings)


def chat_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@pytest.mark.parametrize(
    ("route", "body", "param", "said"),
    [
        (
            "/v1/chat/completions",
            {"messages": ASK, "response_format": chat_format(UNENFORCEABLE)},
            "response_format.json_schema.schema",
            "'uniqueItems'",
        ),
        (
            "/v1/chat/completions",
            {"messages": ASK, "response_format": chat_format({"type": "strings"})},
            "response_format.json_schema.schema",
            "'type'",
        ),
        (
            "/v1/chat/completions",
            {"messages": ASK, "response_format": {"type": "json_object"}, "ignore_eos": True},
            "ignore_eos",
            "ignore_eos",
        ),
        (
            "/v1/chat/completions",
            {"messages": ASK, "response_format": {"type": "xml"}},
            "response_format",
            "'json_schema'",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": ASK,
                "tools": [{**CHAT_TOOL, "function": {"name": "f", "parameters": UNENFORCEABLE}}],
                "tool_choice": "required",
            },
            "tools[0].function.parameters",
            "'uniqueItems'",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": ASK,
                "tools": [CHAT_TOOL],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "response_format",
            "forced tool call",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": ASK,
                "tools": [CHAT_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "absent"}},
            },
            "tool_choice",
            "'absent'",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "response_format": chat_format({"not": {}})},
            "response_format.json_schema.schema",
            "'not'",
        ),
        (
            "/v1/responses",
            {
                "input": "x",
                "text": {"format": {"type": "json_schema", "name": "a", "schema": UNENFORCEABLE}},
            },
            "text.format.schema",
            "'uniqueItems'",
        ),
        (
            "/v1/responses",
            {"input": "x", "text": {"format": {"type": "json_object"}}, "ignore_eos": True},
            "ignore_eos",
            "ignore_eos",
        ),
        (
            "/v1/responses",
            {"input": "x", "tools": [{**FLAT_TOOL, "strict": True, "parameters": UNENFORCEABLE}]},
            "tools[0].parameters",
            "'uniqueItems'",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 8,
                "messages": ASK,
                "tools": [{**MESSAGES_TOOL, "input_schema": UNENFORCEABLE}],
                "tool_choice": {"type": "tool", "name": "get_weather"},
            },
            "tools[0].input_schema",
            "'uniqueItems'",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 200,
                "messages": [*ASK, {"role": "assistant", "content": "Let me"}],
                "tools": [MESSAGES_TOOL],
                "tool_choice": {"type": "any"},
            },
            "messages[1].content",
            "forced tool call",
        ),
    ],
)
def test_what_cannot_be_enforced_is_a_400_naming_field_and_keyword(
    app: Flask, route: str, body: dict[str, Any], param: str, said: str
) -> None:
    reply = app.test_client().post(route, json=body)
    assert reply.status_code == 400, reply.get_json()
    error = reply.get_json()["error"]
    assert said in error["message"], error
    if route == "/v1/messages":  # Anthropic's errors have no param: the message names it
        assert param in error["message"]
    else:
        assert error["param"] == param


def test_a_schema_past_a_bound_is_a_400_naming_it(app: Flask) -> None:
    # A few KiB of allOf over anyOfs multiplies out past llguidance's grammar size.
    schema = {
        "allOf": [{"anyOf": [{"required": [f"p{i}{j}"]} for j in range(12)]} for i in range(5)]
    }
    reply = app.test_client().post(
        "/v1/chat/completions", json={"messages": ASK, "response_format": chat_format(schema)}
    )
    assert reply.status_code == 400
    error = reply.get_json()["error"]
    assert error["param"] == "response_format.json_schema.schema"
    assert "past the bound" in error["message"]


def test_a_budget_below_the_shortest_answer_is_a_400_on_max_tokens(app: Flask) -> None:
    long = {
        "type": "object",
        "properties": {"summary_of_the_answer": {"type": "string", "minLength": 40}},
        "required": ["summary_of_the_answer"],
    }
    client = app.test_client()
    for route, body in (
        ("/v1/chat/completions", {"messages": ASK, "response_format": chat_format(long)}),
        (
            "/v1/messages",
            {"messages": ASK, "tools": [MESSAGES_TOOL], "tool_choice": {"type": "any"}},
        ),
    ):
        reply = client.post(route, json={**body, "max_tokens": 6})
        assert reply.status_code == 400, reply.get_json()
        error = reply.get_json()["error"]
        assert "max_tokens" in error["message"] and "shortest answer" in error["message"]
        assert route == "/v1/messages" or error["param"] == "max_tokens"
    # The same with room for it: a job (in the queue of a model no worker serves).
    fits = {"messages": ASK, "response_format": chat_format(long), "max_tokens": 200}
    job, _ = submitted(
        app,
        "/v1/chat/completions",
        fits,
        ['{"summary_of_the_answer":"' + "x" * 40 + '"}'],
        FinishReason.STOP,
    )
    assert job.params.max_tokens == 200


def submitted(
    app: Flask, route: str, body: dict[str, Any], texts: list[str], reason: FinishReason
) -> tuple[Job, dict[str, Any]]:
    """The job a request made (read before any worker runs it) and the answer once it made
    ``texts``."""
    client, store = app.test_client(), store_of(app)
    key, answer = uuid.uuid4().hex, {}

    def post() -> None:
        reply = client.post(route, json={"model": "late", **body}, headers={"Idempotency-Key": key})
        answer.update(reply.get_json(), status=reply.status_code)

    thread = threading.Thread(target=post)
    thread.start()
    record = wait_for(lambda: store.redis.get(keys.idempotency("", key)), 10, "the job")
    job = store.get(json.loads(record)["job_ids"][0])
    assert job is not None
    drive(store, job.id, texts, reason)
    thread.join(30)
    assert answer.pop("status") == 200, answer
    return job, answer


def test_a_json_schema_answer_is_a_job_with_its_grammar(app: Flask) -> None:
    for route, body in (
        ("/v1/chat/completions", {"messages": ASK, "response_format": chat_format(SCHEMA)}),
        ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_object"}}),
        (
            "/v1/responses",
            {
                "input": "x",
                "text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}},
            },
        ),
    ):
        job, answer = submitted(app, route, body, ['{"n":', "1}"], FinishReason.STOP)
        assert job.params.grammar is not None and "json_schema" in job.params.grammar
        if route == "/v1/responses":
            assert answer["output"][0]["content"][0]["text"] == '{"n":1}'
            assert answer["text"]["format"]["type"] == "json_schema"
            assert answer["text"]["format"]["schema"] == SCHEMA
        elif route == "/v1/completions":
            assert answer["choices"][0]["text"] == '{"n":1}'
        else:
            assert json.loads(answer["choices"][0]["message"]["content"]) == {"n": 1}
    job, _ = submitted(app, "/v1/chat/completions", {"messages": ASK}, ["hi"], FinishReason.STOP)
    assert job.params.grammar is None


def test_a_required_call_is_parsed_into_tool_calls_on_chat(app: Flask) -> None:
    body = {"messages": ASK, "tools": [CHAT_TOOL], "tool_choice": "required", "max_tokens": 200}
    job, answer = submitted(app, "/v1/chat/completions", body, [CALL], FinishReason.STOP)
    assert job.params.grammar is not None and "<tool_call>" in job.params.grammar
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    named = {**body, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    cut = CALL[:30]
    _, answer = submitted(app, "/v1/chat/completions", named, [cut], FinishReason.LENGTH)
    assert answer["choices"][0]["finish_reason"] == "length"


def test_a_forced_call_is_a_function_call_item_and_echoes_the_choice(app: Flask) -> None:
    choice = {"type": "function", "name": "get_weather"}
    body = {
        "input": "x",
        "tools": [{**FLAT_TOOL, "strict": True}],
        "tool_choice": choice,
        "max_output_tokens": 200,
    }
    job, answer = submitted(app, "/v1/responses", body, [CALL], FinishReason.STOP)
    assert job.params.grammar is not None
    (item,) = answer["output"]
    assert item["type"] == "function_call" and item["name"] == "get_weather"
    assert json.loads(item["arguments"]) == {"city": "Oslo"}
    assert answer["tool_choice"] == choice and answer["tools"][0]["strict"] is True
    body = {**body, "tool_choice": "required"}
    _, answer = submitted(app, "/v1/responses", body, [CALL], FinishReason.STOP)
    assert answer["tool_choice"] == "required"


def test_anthropic_any_and_a_named_tool_are_tool_use_blocks(app: Flask) -> None:
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        body = {
            "max_tokens": 200,
            "messages": ASK,
            "tools": [MESSAGES_TOOL],
            "tool_choice": {**choice, "disable_parallel_tool_use": True},
        }
        job, answer = submitted(app, "/v1/messages", body, [CALL, CALL], FinishReason.STOP)
        assert job.params.grammar is not None
        (block,) = answer["content"]  # one call: parallel use disabled
        assert block["type"] == "tool_use" and block["input"] == {"city": "Oslo"}
        assert answer["stop_reason"] == "tool_use"


def test_strict_tools_under_auto_allow_text_or_calls_held_to_the_tools(app: Flask) -> None:
    """The answer's grammar is lazy: text stays text, a call is read as a call, on every route;
    under ``none`` strict tools are no reason for a 400."""
    strict_chat = {**CHAT_TOOL, "function": {**CHAT_TOOL["function"], "strict": True}}
    routes = [
        ("/v1/chat/completions", {"messages": ASK, "tools": [strict_chat], "max_tokens": 200}),
        ("/v1/responses", {"input": "x", "tools": [{**FLAT_TOOL, "strict": True}]}),
        (
            "/v1/messages",
            {"max_tokens": 200, "messages": ASK, "tools": [{**MESSAGES_TOOL, "strict": True}]},
        ),
    ]
    for route, body in routes:
        job, _ = submitted(app, route, body, ["Sunny."], FinishReason.STOP)
        assert job.params.grammar is not None and "lazy" in job.params.grammar, route
        _, answer = submitted(app, route, body, [CALL], FinishReason.STOP)
        assert "get_weather" in json.dumps(answer) and "<tool_call>" not in json.dumps(answer)
    for route, body in routes[:2]:
        job, _ = submitted(app, route, {**body, "tool_choice": "none"}, ["Hi"], FinishReason.STOP)
        assert job.params.grammar is None, route


def test_a_custom_format_is_served_unchecked_and_named_in_a_header(app: Flask) -> None:
    """A format no specification defines is an annotation in JSON Schema: the schema is served
    and the answer's ``Trickle-Unchecked-Formats`` header names it (none where all are known)."""
    custom = {
        "type": "object",
        "properties": {"t": {"type": "string", "format": "topic"}, "e": {"format": "email"}},
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": custom, "strict": True}}
    client = app.test_client()
    for body in (
        {"messages": ASK, "response_format": chat_format(custom), "stream": True},
        {"messages": ASK, "tools": [tool], "tool_choice": "required", "stream": True},
    ):
        reply = client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.get_data()
        assert reply.headers["Trickle-Unchecked-Formats"] == "topic"
        reply.close()
    reply = client.post(
        "/v1/chat/completions",
        json={"messages": ASK, "response_format": chat_format(SCHEMA), "stream": True},
    )
    assert reply.status_code == 200 and "Trickle-Unchecked-Formats" not in reply.headers
    reply.close()
    # A name no header may carry as it is (CR LF, a comma, non-ASCII): percent-encoded.
    odd = {"type": "string", "format": "a\r\nSet-Cookie: x=1, 日付"}
    reply = client.post(
        "/v1/chat/completions",
        json={"messages": ASK, "response_format": chat_format(odd), "stream": True},
    )
    assert reply.status_code == 200, reply.get_data()
    assert "Set-Cookie" not in reply.headers
    assert reply.headers["Trickle-Unchecked-Formats"] == (
        "a%0D%0ASet-Cookie%3A%20x%3D1%2C%20%E6%97%A5%E4%BB%98"
    )
    reply.close()
