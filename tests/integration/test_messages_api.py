"""Anthropic's Messages API in process on a real Redis: every refusal in Anthropic's error shape
naming what was wrong, ``x-api-key`` as the key, rate limits, and ``count_tokens`` (streams,
prompts and stop reasons, with the job driven by hand: test_messages_stream.py)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.messages_client import refused
from trickle.config.sections import AuthSettings, RateLimitSettings
from trickle.config.settings import Settings
from trickle.tenants import build_keys

USER = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Flask:
    return make_app(settings)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"max_tokens": None}, ("max_tokens", "required")),
        ({"max_tokens": 0}, ("max_tokens",)),
        ({"max_tokens": 5000}, ("max_tokens", "1024")),
        ({"messages": [{"role": "system", "content": "x"}]}, ("messages[0].role", "'system'")),
        ({"messages": [{"role": "tool", "content": "x"}]}, ("messages[0].role", "'tool'")),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}
                ]
            },
            ("messages[0].content[1].type", "'image'"),
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}
                ]
            },
            ("messages[0].content[0].tool_use_id", "'t'"),
        ),
        ({"system": [{"type": "document"}]}, ("system[0].type", "'document'")),
        ({"messages": []}, ("messages",)),
        ({"tools": [{"type": "web_search_20250305", "name": "s"}]}, ("tools[0].type", "server")),
        ({"tool_choice": {"type": "any"}}, ("tool_choice", "no tools")),
        ({"tool_choice": "none"}, ("tool_choice",)),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, ("thinking",)),
        ({"temperature": 1.5}, ("temperature",)),
        ({"stop_sequences": ["a"] * 20}, ("stop_sequences",)),
        ({"metadata": {"user_id": 5}}, ("metadata.user_id",)),
    ],
)
def test_bad_requests_are_anthropic_errors_naming_the_field(
    client: FlaskClient, change: dict[str, Any], named: tuple[str, ...]
) -> None:
    body = {"model": "late", "max_tokens": 8, "messages": USER, **change}
    body = {name: value for name, value in body.items() if value is not None}
    refused(client.post("/v1/messages", json=body), 400, "invalid_request_error", *named)


def test_count_tokens_refuses_alike_and_takes_no_max_tokens(client: FlaskClient) -> None:
    reply = client.post(
        "/v1/messages/count_tokens", json={"messages": [{"role": "system", "content": "x"}]}
    )
    refused(reply, 400, "invalid_request_error", "messages[0].role")
    reply = client.post("/v1/messages/count_tokens", json={"messages": USER, "max_tokens": 3})
    refused(reply, 400, "invalid_request_error", "max_tokens")


def test_other_refusals_keep_their_status_in_anthropics_shape(client: FlaskClient) -> None:
    base = {"model": "late", "max_tokens": 8, "messages": USER}
    reply = client.post("/v1/messages", json={**base, "model": "claude-nothing"})
    refused(reply, 404, "not_found_error", "model", "claude-nothing")
    refused(client.post("/v1/messages", data="{"), 400, "invalid_request_error", "body")
    refused(client.get("/v1/messages"), 405, "invalid_request_error")
    refused(client.post("/v1/messages/nothing", json=base), 404, "not_found_error")
    headers = {"anthropic-version": "latest"}
    reply = client.post("/v1/messages", json=base, headers=headers)
    refused(reply, 400, "invalid_request_error", "anthropic-version", "latest")
    too_long = {"Idempotency-Key": "k" * 300}
    refused(client.post("/v1/messages", json=base, headers=too_long), 400, "invalid_request_error")
    # Resuming needs a stream and the key of the stream it resumes.
    resume = {"Last-Event-ID": "3"}
    message = refused(
        client.post("/v1/messages", json={**base, "stream": True}, headers=resume),
        400,
        "invalid_request_error",
        "Last-Event-ID",
    )
    assert "Idempotency-Key" in message
    resume["Idempotency-Key"] = uuid.uuid4().hex
    reply = client.post("/v1/messages", json=base, headers=resume)
    refused(reply, 400, "invalid_request_error", "Last-Event-ID", "stream")
    # A key that created nothing has nothing to resume (a new stream would lose tokens 0..3).
    reply = client.post("/v1/messages", json={**base, "stream": True}, headers=resume)
    refused(reply, 404, "not_found_error", "Idempotency-Key", "resume")
    # The OpenAI routes keep OpenAI's shape.
    openai = client.post("/v1/chat/completions", json={"messages": 5}).get_json()
    assert set(openai) == {"error"} and openai["error"]["param"] == "messages"


def test_the_key_comes_as_x_api_key_or_bearer_and_errors_are_anthropics(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    keyed = dataclasses.replace(settings, auth=AuthSettings(api_keys=("sk-good",)))
    client = make_app(keyed).test_client()
    body = {"messages": USER}
    route = "/v1/messages/count_tokens"
    refused(client.post(route, json=body), 401, "authentication_error", "x-api-key")
    bad = client.post(route, json=body, headers={"x-api-key": "sk-bad"})
    refused(bad, 401, "authentication_error", "invalid API key")
    for headers in ({"x-api-key": "sk-good"}, {"Authorization": "Bearer sk-good"}):
        reply = client.post(route, json=body, headers=headers)
        assert reply.status_code == 200, reply.get_json()
    # x-api-key opens the other /v1 routes too; their errors stay OpenAI's.
    assert client.get("/v1/models", headers={"x-api-key": "sk-good"}).status_code == 200
    assert client.get("/v1/models").get_json()["error"]["code"] == "invalid_api_key"


def test_over_a_rate_limit_is_a_rate_limit_error(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    name = f"tight-{uuid.uuid4().hex[:8]}"
    tables = {name: {"key": f"k-{name}", "tokens_per_minute": 5}}
    keyed = dataclasses.replace(
        settings, keys=build_keys(tables), rate_limits=RateLimitSettings(0, 0)
    )
    client = make_app(keyed).test_client()
    body = {"model": "late", "max_tokens": 100, "messages": USER}
    reply = client.post("/v1/messages", json=body, headers={"x-api-key": f"k-{name}"})
    refused(reply, 429, "rate_limit_error", "tokens_per_minute")
    assert int(reply.headers["Retry-After"]) >= 1


def test_count_tokens_is_the_prompt_a_message_would_have(app: Flask) -> None:
    client = app.test_client()

    def count(**body: Any) -> int:
        reply = client.post("/v1/messages/count_tokens", json={"model": "late", **body})
        assert reply.status_code == 200, reply.get_json()
        assert set(reply.get_json()) == {"input_tokens"}
        return int(reply.get_json()["input_tokens"])

    plain = count(messages=USER)
    assert plain > 0
    assert count(messages=USER, system="Answer in one long sentence, please.") > plain
    blocks = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}],
        }
    ]
    assert count(messages=blocks) == plain
    # The stored job's prompt tokens are what count_tokens said.
    created = client.post(
        "/v1/messages",
        json={"model": "late", "max_tokens": 4, "messages": USER, "stream": True},
        headers={"Idempotency-Key": uuid.uuid4().hex},
        buffered=False,
    )
    first = next(iter(created.response))  # type: ignore[call-overload]
    created.close()
    start = json.loads(first.decode().split("data: ", 1)[1].split("\n", 1)[0])
    assert start["message"]["usage"]["input_tokens"] == plain


def test_bodies_outside_the_limits_are_anthropic_errors(client: FlaskClient) -> None:
    deep = b'{"max_tokens": 1, "messages": ' + b"[" * 40 + b"]" * 40 + b"}"
    refused(client.post("/v1/messages", data=deep), 400, "invalid_request_error", "body", "32")
    huge = b'{"max_tokens": 1' + b"0" * 80 + b', "messages": []}'
    refused(client.post("/v1/messages", data=huge), 400, "invalid_request_error", "64 digits")
    lone = b'{"max_tokens": 1, "messages": [{"role": "user", "content": "\\ud800"}]}'
    reply = client.post("/v1/messages", data=lone)
    refused(reply, 400, "invalid_request_error", "messages[0].content", "surrogate")
    big = {"max_tokens": 1, "messages": [{"role": "user", "content": "x" * 70_000}]}
    refused(client.post("/v1/messages", json=big), 413, "request_too_large", "body")
