"""Anthropic's Messages API streams in process on a real Redis: the prompt a conversation
becomes, a stream that drops and resumes after the last delta it delivered, a dropped stream
without a key cancelling its job, the stop reasons from a job's end, and no subscription left
behind; each job driven the way workers drive one (claim, fenced token appends, finish)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask

from tests.faultstack import wait_for
from tests.messages_client import Reader, append, finish, job_of, refused, store_of, text_of
from trickle import keys
from trickle.config.settings import Settings
from trickle.jobs import FinishReason, JobStatus
from web.services import services

USER = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Flask:
    return make_app(settings)


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


def test_streams_leave_no_subscription_behind(app: Flask) -> None:
    client, hub = app.test_client(), services(app).hub
    baseline = hub.active_subscriptions
    body = {"model": "late", "max_tokens": 10, "messages": USER, "stream": True}
    for headers in ({}, {"Idempotency-Key": uuid.uuid4().hex}):
        Reader(client, body, headers, stop_after=3).join()  # the client leaves after the head
    # A response never read at all.
    client.post("/v1/messages", json=body, buffered=False).close()
    wait_for(lambda: hub.active_subscriptions == baseline, 10, "the subscriptions to close")
