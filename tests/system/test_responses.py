"""The Responses API through the official `openai` client against the real running stack:
objects it parses strictly, event streams numbered from the job's token log, background
responses resumed from any event, cancel, delete and conversations. Every test sends
``served_model`` (demo, or SmolLM2 under `make test-real-model`)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import openai
import pytest
import requests
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.clients import get_job

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)

pytestmark = pytest.mark.both_models


@pytest.fixture(scope="module")
def client(stack_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack_url}/v1", api_key="not-needed", max_retries=0)


def raw_events(
    base: str, response_id: str, after: int | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """The resumed stream's events as JSON, read with plain HTTP (``limit``: stop early)."""
    query = "stream=true" + ("" if after is None else f"&starting_after={after}")
    events: list[dict[str, Any]] = []
    with requests.get(f"{base}/v1/responses/{response_id}?{query}", stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if limit is not None and len(events) >= limit:
                    break
    return events


def test_create_and_retrieve_parse_strictly(
    client: openai.OpenAI, stack_url: str, served_model: str
) -> None:
    response = client.responses.create(
        model=served_model,
        input="The socket module",
        instructions="Write Python.",
        max_output_tokens=16,
        temperature=0,
        metadata={"run": "1"},
    )
    assert response.object == "response" and response.status in ("completed", "incomplete")
    assert response.output_text and response.usage is not None
    assert (
        response.usage.output_tokens
        == get_job(stack_url, "job_" + response.id[5:])["usage"]["completion_tokens"]
    )
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.tools == [] and response.parallel_tool_calls is True
    assert response.metadata == {"run": "1"} and response.instructions == "Write Python."
    raw = requests.get(f"{stack_url}/v1/responses/{response.id}", timeout=10).json()
    strict = Response.model_validate(raw, strict=True)
    assert strict.output_text == response.output_text
    assert client.responses.retrieve(response.id).output_text == response.output_text


def test_max_output_tokens_makes_an_incomplete_response(
    client: openai.OpenAI, served_model: str
) -> None:
    args: dict[str, Any] = {"model": served_model, "input": "The", "max_output_tokens": 5}
    response = client.responses.create(**args, extra_body={"ignore_eos": True})
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    events = list(client.responses.create(**args, stream=True, extra_body={"ignore_eos": True}))
    assert events[-1].type == "response.incomplete"


def test_stream_events_are_numbered_and_complete(client: openai.OpenAI, served_model: str) -> None:
    stream = client.responses.create(
        model=served_model, input="Return the", max_output_tokens=12, temperature=0, stream=True
    )
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response  # type: ignore[union-attr]
    assert "".join(d.delta for d in deltas) == final.output_text
    assert final.usage is not None and len(deltas) == final.usage.output_tokens
    whole = client.responses.create(
        model=served_model, input="Return the", max_output_tokens=12, temperature=0
    )
    assert whole.output_text == final.output_text


def test_background_stream_resumes_from_any_event(
    client: openai.OpenAI, stack_url: str, served_model: str
) -> None:
    args: dict[str, Any] = {"model": served_model, "input": "The", "max_output_tokens": 32}
    stream = client.responses.create(
        **args, background=True, stream=True, extra_body={"ignore_eos": True}
    )
    first: list[Any] = []
    for event in stream:
        first.append(event.model_dump())
        if len(first) == 10:
            break
    stream.close()  # a background response runs on without its client
    response_id = first[0]["response"]["id"]
    assert first[0]["response"]["status"] == "queued" and first[0]["response"]["background"]
    rest = raw_events(stack_url, response_id, after=9)
    whole = first + rest
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    assert whole[-1]["type"] == "response.incomplete"
    # After the end: the same events, number for number, from the start or from any event.
    again = raw_events(stack_url, response_id)
    for event in again:  # every event as OpenAI's types have it, strictly
        assert STREAM_EVENT.validate_python(event, strict=True).type == event["type"]
    assert [(e["type"], e.get("delta")) for e in again] == [
        (e["type"], e.get("delta")) for e in whole
    ]
    assert raw_events(stack_url, response_id, after=30) == again[31:]
    last = len(again) - 1
    assert raw_events(stack_url, response_id, after=last) == []
    past = requests.get(
        f"{stack_url}/v1/responses/{response_id}?stream=true&starting_after={last + 1}", timeout=10
    )
    assert past.status_code == 400 and past.json()["error"]["param"] == "starting_after"
    resumed = list(client.responses.retrieve(response_id, stream=True, starting_after=last - 2))
    assert [e.sequence_number for e in resumed] == [last - 1, last]


def test_background_without_a_stream_is_polled(client: openai.OpenAI, served_model: str) -> None:
    response = client.responses.create(
        model=served_model, input="The", max_output_tokens=12, background=True
    )
    assert response.status == "queued" and response.background is True
    deadline = time.monotonic() + 30
    while response.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.1)
        response = client.responses.retrieve(response.id)
    assert response.status in ("completed", "incomplete") and response.output_text


def test_waiting_past_the_last_event_so_far_then_cancel(
    client: openai.OpenAI, stack_url: str
) -> None:
    """No worker serves ``late``: its response stays queued, so a reader resuming past the
    events known so far waits; a cancel ends the response (and the reader)."""
    response = client.responses.create(model="late", input="The", background=True)
    received: list[str] = []

    def read() -> None:
        url = f"{stack_url}/v1/responses/{response.id}?stream=true&starting_after=3"
        with requests.get(url, stream=True, timeout=60) as r:
            received.extend(line for line in r.iter_lines(decode_unicode=True) if line)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(1.0)
    assert not [line for line in received if line.startswith("data:")]
    canceled = client.responses.cancel(response.id)
    assert canceled.status == "cancelled"
    reader.join(30)
    kinds = [json.loads(line[6:])["type"] for line in received if line.startswith("data:")]
    assert kinds == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]


def test_delete_and_unknown_responses(
    client: openai.OpenAI, stack_url: str, served_model: str
) -> None:
    response = client.responses.create(model=served_model, input="The", max_output_tokens=4)
    assert client.responses.delete(response.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    for path in ("resp_" + "0" * 32, "nope", "resp_" + "0" * 32 + "/cancel"):
        method = requests.post if path.endswith("cancel") else requests.get
        assert method(f"{stack_url}/v1/responses/{path}", timeout=10).status_code == 404
    assert requests.delete(f"{stack_url}/v1/responses/{response.id}", timeout=10).status_code == 404


def test_previous_response_id_continues_the_conversation(
    client: openai.OpenAI, served_model: str
) -> None:
    first = client.responses.create(model=served_model, input="The socket", max_output_tokens=8)
    alone = client.responses.create(model=served_model, input="And then", max_output_tokens=8)
    second = client.responses.create(
        model=served_model, input="And then", previous_response_id=first.id, max_output_tokens=8
    )
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None and alone.usage is not None
    # The prompt now holds the first turn and its answer as well.
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.create(
            model=served_model, input="x", previous_response_id="resp_" + "0" * 32
        )


def test_logprobs_on_text_events(client: openai.OpenAI, served_model: str) -> None:
    events = list(
        client.responses.create(
            model=served_model,
            input="The",
            max_output_tokens=6,
            include=["message.output_text.logprobs"],
            top_logprobs=1,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert all(len(d.logprobs) == 1 and d.logprobs[0].logprob <= 0 for d in deltas)
    final = events[-1].response  # type: ignore[union-attr]
    part = final.output[0].content[0]
    assert [lp.token for lp in part.logprobs] == [d.delta for d in deltas]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"not": {}}}}},
            "text.format.schema",
        ),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"top_logprobs": 21, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
        ({"background": True, "store": False}, "background"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_tokens": 5}, "max_tokens"),
    ],
)
def test_unsupported_fields_are_refused_by_name(
    stack_url: str, body: dict[str, Any], param: str, served_model: str
) -> None:
    reply = requests.post(
        f"{stack_url}/v1/responses", json={"model": served_model, "input": "x", **body}, timeout=10
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"].startswith(param)


def test_bad_starting_after_is_a_400(
    client: openai.OpenAI, stack_url: str, served_model: str
) -> None:
    response = client.responses.create(model=served_model, input="The", max_output_tokens=2)
    for value in ("-1", "x"):
        reply = requests.get(
            f"{stack_url}/v1/responses/{response.id}?stream=true&starting_after={value}",
            timeout=10,
        )
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "starting_after"
