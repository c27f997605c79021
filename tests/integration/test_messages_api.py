"""Anthropic's Messages API in process on a real Redis: every refusal in Anthropic's error shape
naming what was wrong, ``x-api-key`` as the key, the stop reasons from a job's end, and a stream
that drops and resumes after the last delta it delivered, its job driven the way workers drive
one (claim, fenced token appends, finish)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.faultstack import wait_for
from trickle import keys
from trickle.config.sections import AuthSettings, RateLimitSettings
from trickle.config.settings import Settings
from trickle.events import TokenEvent
from trickle.jobs import FinishReason, JobResult, JobStatus
from trickle.store.job_store import JobStore, StepAppend
from trickle.tenants import build_keys
from web.services import services

USER = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Flask:
    return make_app(settings)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def refused(reply: Any, status: int, kind: str, *named: str) -> str:
    """The Anthropic error body of ``reply``, checked; its message names every one of ``named``."""
    body = reply.get_json()
    assert reply.status_code == status, body
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind, body
    message: str = body["error"]["message"]
    for name in named:
        assert name in message, message
    return message


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


def test_the_prompt_is_the_conversation_through_the_template(app: Flask) -> None:
    """Consecutive turns of one role are one turn; a final assistant turn is continued."""
    client, store = app.test_client(), store_of(app)
    messages = [
        {"role": "user", "content": "Hi"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "A "}, {"type": "text", "text": "B"}],
        },
        {"role": "assistant", "content": "Sure"},
        {"role": "user", "content": "Go on"},
        {"role": "assistant", "content": "The answer is"},
    ]
    body = {
        "model": "late",
        "max_tokens": 4,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": messages,
        "stream": True,
    }
    reader = Reader(client, body, {"Idempotency-Key": uuid.uuid4().hex}, stop_after=1)
    job_id = job_of(reader.join())
    prompt = store.redis.hget(keys.job(job_id), "prompt")
    assert prompt == (
        "System: Be brief.\nUser: Hi\n\nA B\nAssistant: Sure\nUser: Go on\nAssistant:The answer is"
    )


# ---- streams and stop reasons, the job driven by hand -------------------------------------


def store_of(app: Flask) -> JobStore:
    return services(app).store


def append(store: JobStore, job_id: str, fence: str, first: int, count: int) -> None:
    tokens = [TokenEvent(job_id, i, f"<{i}>", -0.5) for i in range(first, first + count)]
    pipe = store.redis.pipeline(transaction=False)
    store.queue_step(pipe, [StepAppend(job_id, fence, tokens, time.time())])
    (reply,) = pipe.execute()
    assert not store.step_outcome([StepAppend(job_id, fence, tokens)], reply).fenced_out


def finish(
    store: JobStore, job_id: str, fence: str, count: int, reason: FinishReason, stop: str = ""
) -> None:
    output = "".join(f"<{i}>" for i in range(count))
    result = JobResult(JobStatus.SUCCEEDED, output, reason, count, time.time(), stop_sequence=stop)
    assert store.finish(job_id, fence, result)


def events_of(text: str) -> list[tuple[str | None, str, dict[str, Any]]]:
    """(id, event, data) of every SSE event in ``text``."""
    found = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            found.append((fields.get("id"), fields["event"], json.loads(fields["data"])))
    return found


class Reader:
    """A stream read on a thread; ``stop_after`` events, then the client drops it."""

    def __init__(
        self,
        client: FlaskClient,
        body: dict[str, Any],
        headers: dict[str, str],
        stop_after: int | None = None,
    ):
        self.text = ""
        self.events: list[tuple[str | None, str, dict[str, Any]]] = []
        self._thread = threading.Thread(target=self._read, args=(client, body, headers, stop_after))
        self._thread.start()

    def _read(
        self,
        client: FlaskClient,
        body: dict[str, Any],
        headers: dict[str, str],
        stop_after: int | None,
    ) -> None:
        reply = client.post("/v1/messages", json=body, headers=headers, buffered=False)
        assert reply.status_code == 200, reply.get_data(as_text=True)
        for chunk in reply.response:  # type: ignore[union-attr]
            self.text += chunk.decode()
            self.events = events_of(self.text)
            if stop_after is not None and len(self.events) >= stop_after:
                break
        reply.close()

    def join(self) -> list[tuple[str | None, str, dict[str, Any]]]:
        self._thread.join(30)
        assert not self._thread.is_alive()
        return self.events


def job_of(events: list[tuple[str | None, str, dict[str, Any]]]) -> str:
    return "job_" + events[0][2]["message"]["id"].removeprefix("msg_")


def text_of(events: list[tuple[str | None, str, dict[str, Any]]]) -> str:
    return "".join(e[2]["delta"]["text"] for e in events if e[1] == "content_block_delta")


def test_a_dropped_stream_resumes_after_its_last_delta(app: Flask) -> None:
    client, store = app.test_client(), store_of(app)
    body = {"model": "late", "max_tokens": 10, "messages": USER, "stream": True}
    headers = {"Idempotency-Key": uuid.uuid4().hex}
    first = Reader(client, body, headers, stop_after=4)  # the head and one delta, then it drops
    wait_for(lambda: len(first.events) >= 3, 10, "the stream's head")
    assert [e[1] for e in first.events] == ["message_start", "content_block_start", "ping"]
    job_id = job_of(first.events)
    claim = store.leases.claim(job_id, "a", time.time(), lease_ms=60_000, max_attempts=5)
    append(store, job_id, claim.fence, 0, 3)
    dropped = first.join()
    last_id = dropped[-1][0]
    assert dropped[-1][1] == "content_block_delta" and last_id is not None
    # With an Idempotency-Key its job runs on without the connection.
    time.sleep(0.2)
    assert store.get(job_id).status is JobStatus.RUNNING  # type: ignore[union-attr]
    append(store, job_id, claim.fence, 3, 4)
    resumed = Reader(client, body, {**headers, "Last-Event-ID": last_id})
    wait_for(lambda: text_of(resumed.events).endswith("<6>"), 10, "the missed deltas")
    finish(store, job_id, claim.fence, 7, FinishReason.STOP, stop="\n\n")
    events = resumed.join()
    assert job_of(events) == job_id
    assert [e[1] for e in events][:3] == ["message_start", "content_block_start", "ping"]
    assert [e[1] for e in events][-3:] == ["content_block_stop", "message_delta", "message_stop"]
    output = store.get(job_id).output  # type: ignore[union-attr]
    assert text_of(dropped) + text_of(events) == output == "".join(f"<{i}>" for i in range(7))
    delta = events[-2][2]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "\n\n"}
    assert delta["usage"]["output_tokens"] == 7
    # After the end, a resume from any delta gives the rest; ids are the deltas' last tokens.
    again = Reader(client, body, {**headers, "Last-Event-ID": "4"}).join()
    assert text_of(again) == "<5><6>"
    assert [e[0] for e in again if e[0] is not None] == ["6"]
    # The key names that request: another body under it is refused, in Anthropic's shape.
    other = client.post("/v1/messages", json={**body, "stream": False}, headers=headers)
    refused(other, 422, "invalid_request_error", "Idempotency-Key")


def test_a_dropped_stream_without_a_key_cancels_its_job(app: Flask) -> None:
    client, store = app.test_client(), store_of(app)
    body = {"model": "late", "max_tokens": 10, "messages": USER, "stream": True}
    reader = Reader(client, body, {}, stop_after=3)
    job_id = job_of(reader.join())
    wait_for(
        lambda: store.get(job_id).status is JobStatus.CANCELED,  # type: ignore[union-attr]
        10,
        "the job to be canceled",
    )


@pytest.mark.parametrize(
    ("reason", "stop", "stop_reason"),
    [
        (FinishReason.LENGTH, "", "max_tokens"),
        (FinishReason.STOP, "", "end_turn"),
        (FinishReason.STOP, "END", "stop_sequence"),
    ],
)
def test_the_message_object_says_why_it_ended(
    app: Flask, reason: FinishReason, stop: str, stop_reason: str
) -> None:
    client, store = app.test_client(), store_of(app)
    body = {"model": "late", "max_tokens": 3, "messages": USER, "stop_sequences": ["END"]}
    answer: dict[str, Any] = {}
    key = uuid.uuid4().hex

    def post() -> None:
        reply = client.post("/v1/messages", json=body, headers={"Idempotency-Key": key})
        answer.update(reply.get_json(), status=reply.status_code)

    thread = threading.Thread(target=post)
    thread.start()
    record = wait_for(lambda: store.redis.get(keys.idempotency("", key)), 10, "the message's job")
    job_id = json.loads(record)["job_ids"][0]
    claim = store.leases.claim(job_id, "a", time.time(), lease_ms=60_000, max_attempts=5)
    append(store, job_id, claim.fence, 0, 2)
    finish(store, job_id, claim.fence, 2, reason, stop)
    thread.join(30)
    assert answer.pop("status") == 200, answer
    assert answer == {
        "id": "msg_" + job_id.removeprefix("job_"),
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "<0><1>"}],
        "model": "late",
        "stop_reason": stop_reason,
        "stop_sequence": stop or None,
        "usage": {
            "input_tokens": store.get(job_id).usage.prompt_tokens,  # type: ignore[union-attr]
            "output_tokens": 2,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


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


def test_streams_leave_no_subscription_behind(app: Flask) -> None:
    client, hub = app.test_client(), services(app).hub
    baseline = hub.active_subscriptions
    body = {"model": "late", "max_tokens": 10, "messages": USER, "stream": True}
    for headers in ({}, {"Idempotency-Key": uuid.uuid4().hex}):
        Reader(client, body, headers, stop_after=3).join()  # the client leaves after the head
    # A response never read at all.
    client.post("/v1/messages", json=body, buffered=False).close()
    wait_for(lambda: hub.active_subscriptions == baseline, 10, "the subscriptions to close")
