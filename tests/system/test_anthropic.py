"""The official `anthropic` client against the real running stack: plain and streamed messages
on the same jobs as every other route (the streamed text equals the stored output, byte for
byte), stop reasons, count_tokens, errors as the client raises them, and a dropped stream
resumed after its last delta. Every test sends ``served_model`` (demo, or SmolLM2 under
`make test-real-model`)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import anthropic
import pytest
import requests
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from tests.clients import get_job, poll_until_finished

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
USER: list[Any] = [{"role": "user", "content": "The socket module"}]

pytestmark = pytest.mark.both_models


@pytest.fixture(scope="module")
def client(stack_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack_url, api_key="not-needed", max_retries=0)


def job_of(message_id: str) -> str:
    assert message_id.startswith("msg_")
    return "job_" + message_id.removeprefix("msg_")


def test_a_message_is_a_job_and_parses_strictly(
    client: anthropic.Anthropic, stack_url: str, served_model: str
) -> None:
    message = client.messages.create(
        model=served_model,
        max_tokens=12,
        system="Write Python.",
        messages=USER,
        extra_body={"temperature": 0},
        metadata={"user_id": "u-1"},
    )
    job = get_job(stack_url, job_of(message.id))
    assert (
        message.type == "message" and message.role == "assistant" and message.model == served_model
    )
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == job["output"]  # type: ignore[union-attr]
    assert message.usage.output_tokens == job["usage"]["completion_tokens"]
    assert message.usage.input_tokens == job["usage"]["prompt_tokens"]
    expected = "max_tokens" if job["finish_reason"] == "length" else "end_turn"
    assert message.stop_reason == expected and message.stop_sequence is None
    raw = requests.post(
        f"{stack_url}/v1/messages",
        json={
            "model": served_model,
            "max_tokens": 12,
            "system": "Write Python.",
            "messages": USER,
            "temperature": 0,
        },
        headers={"anthropic-version": "2023-06-01"},
        timeout=60,
    ).json()
    assert Message.model_validate(raw, strict=True).content == message.content  # greedy: equal
    tokens = client.messages.count_tokens(model=served_model, system="Write Python.", messages=USER)
    assert tokens.input_tokens == message.usage.input_tokens


def test_the_streamed_text_is_the_stored_output(
    client: anthropic.Anthropic, stack_url: str, served_model: str
) -> None:
    kinds: list[str] = []
    text = ""
    stream = client.messages.create(
        model=served_model,
        max_tokens=16,
        messages=USER,
        extra_body={"temperature": 0.9},
        stream=True,
    )
    for event in stream:
        kinds.append(event.type)
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            text += event.delta.text
        if event.type == "message_start":
            message_id = event.message.id
            assert event.message.content == [] and event.message.stop_reason is None
        if event.type == "message_delta":
            final_delta = event
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) <= {"content_block_delta"}
    job = get_job(stack_url, job_of(message_id))
    assert text == job["output"] and job["status"] == "succeeded"
    assert final_delta.usage.output_tokens == job["usage"]["completion_tokens"]
    # The helper that accumulates the stream agrees.
    with client.messages.stream(model=served_model, max_tokens=12, messages=USER) as helper:
        streamed = "".join(helper.text_stream)
        final = helper.get_final_message()
    assert streamed == final.content[0].text == get_job(stack_url, job_of(final.id))["output"]  # type: ignore[union-attr]


def test_a_stop_sequence_ends_the_message_and_is_named(
    client: anthropic.Anthropic, served_model: str
) -> None:
    free = client.messages.create(
        model=served_model, max_tokens=20, messages=USER, extra_body={"temperature": 0}
    )
    text = free.content[0].text  # type: ignore[union-attr]
    words = text.split()
    assert len(words) > 3, text
    stop = words[2]
    cut = client.messages.create(
        model=served_model,
        max_tokens=20,
        messages=USER,
        extra_body={"temperature": 0},
        stop_sequences=["\x07", stop],
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]
    stream = client.messages.create(
        model=served_model,
        max_tokens=20,
        messages=USER,
        extra_body={"temperature": 0},
        stop_sequences=[stop],
        stream=True,
    )
    events = list(stream)
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == "stop_sequence" and delta.delta.stop_sequence == stop


def test_errors_are_what_the_client_raises(client: anthropic.Anthropic, served_model: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model=served_model,
            max_tokens=8,
            messages=[{"role": "system", "content": "x"}],  # type: ignore[list-item]
        )
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "messages[0].role" in bad.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as tools:
        client.messages.create(
            model=served_model,
            max_tokens=8,
            messages=USER,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )
    assert "tools[0].type" in tools.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-nothing", max_tokens=8, messages=USER)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def sse_events(
    lines: Any, limit: int | None = None
) -> list[tuple[str | None, str, dict[str, Any]]]:
    """(id, event, data) of a raw stream's events; ``limit``: stop reading after that many."""
    found: list[tuple[str | None, str, dict[str, Any]]] = []
    fields: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        if "event" in fields:
            found.append((fields.get("id"), fields["event"], json.loads(fields["data"])))
            if limit is not None and len(found) >= limit:
                break
        fields = {}
    return found


def test_a_dropped_stream_resumes_with_its_key(
    client: anthropic.Anthropic, stack_url: str, served_model: str
) -> None:
    body = {"model": served_model, "max_tokens": 24, "messages": USER, "stream": True}
    key = uuid.uuid4().hex
    with requests.post(
        f"{stack_url}/v1/messages",
        json=body,
        headers={"Idempotency-Key": key},
        stream=True,
        timeout=60,
    ) as dropped:
        assert dropped.status_code == 200
        first = sse_events(dropped.iter_lines(decode_unicode=True), limit=4)
    assert [e[1] for e in first] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
    ]
    for _id, kind, data in first:  # every event as the client's types have it, strictly
        if kind != "ping":
            assert STREAM_EVENT.validate_python(data, strict=True).type == kind
    last_id = first[-1][0]
    assert last_id is not None
    job_id = job_of(first[0][2]["message"]["id"])
    # The SDK sends the same request again with the key and the last delta's id.
    rest = client.messages.create(
        model=served_model,
        max_tokens=24,
        messages=USER,
        stream=True,
        extra_headers={"Idempotency-Key": key, "Last-Event-ID": last_id},
    )
    resumed = "".join(
        e.delta.text
        for e in rest
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    job = poll_until_finished(stack_url, job_id)
    assert job["status"] == "succeeded"
    assert first[-1][2]["delta"]["text"] + resumed == job["output"]
    # After the end, the same resume read raw: every event strictly of the client's types.
    headers = {"Idempotency-Key": key, "Last-Event-ID": last_id}
    with requests.post(
        f"{stack_url}/v1/messages", json=body, headers=headers, stream=True, timeout=60
    ) as again:
        events = sse_events(again.iter_lines(decode_unicode=True))
    assert [e[1] for e in events[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    for _id, kind, data in events:
        if kind != "ping":
            assert STREAM_EVENT.validate_python(data, strict=True).type == kind
    deltas = [e[2]["delta"]["text"] for e in events if e[1] == "content_block_delta"]
    assert "".join(deltas) == resumed
    # Trickle's own events of the same job resume from the same id.
    native = requests.get(
        f"{stack_url}/v1/jobs/{job_id}/events", headers={"Last-Event-ID": last_id}, timeout=60
    )
    tokens = [e[2]["text"] for e in sse_events(native.text.splitlines()) if e[1] == "token"]
    assert first[-1][2]["delta"]["text"] + "".join(tokens) == job["output"]


def test_the_models_list_is_anthropics_too(client: anthropic.Anthropic, served_model: str) -> None:
    models = client.models.list()
    assert {m.id for m in models.data} == {"demo", "tiny-llama", "scripted", "late", served_model}
    assert models.has_more is False and models.first_id == models.data[0].id
    served = client.models.retrieve(served_model)
    assert served.type == "model" and served.display_name == served_model
    assert served.created_at.tzinfo is not None  # an RFC 3339 time, parsed
