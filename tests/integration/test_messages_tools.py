"""Tools on Anthropic's Messages API in process on a real Redis: the refusals by field, the
conversation rendered through the same template (and turns) as the OpenAI chat route's, and a
job driven by hand with a hermes-style call cut across tokens, answered as ``tool_use`` blocks
whole and streamed, and resumed after every event id with exactly the rest."""

from __future__ import annotations

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
from tests.messages_client import Reader, job_of, refused, store_of
from trickle import keys
from trickle.config.settings import Settings
from trickle.events import TokenEvent
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, JobStatus
from trickle.store.job_store import JobStore, StepAppend
from web.anthropic.models import messages_models
from web.anthropic.request import parse_messages
from web.common.tools.calls import tool_use_id
from web.openai.requests import parse_chat_request

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
ASK = {"role": "user", "content": "Weather in Paris?"}
CALLED = {
    "role": "assistant",
    "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ],
}
RESULT = {
    "role": "user",
    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
}
# A hermes call cut across tokens after some text, as a model writes it.
TEXTS = [
    "Let me",
    " check.",
    "<tool_",
    'call>{"name": "get_',
    'weather", "arguments": {"city": ',
    '"Paris"}}',
    "</tool_call>",
]
CALL_TEXT = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'


@pytest.fixture(scope="module")
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Flask:
    return make_app(settings)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"tools": [{**WEATHER, "name": "a b"}]}, ("tools[0].name",)),
        ({"tools": [{"name": "f"}]}, ("tools[0].input_schema",)),
        ({"tools": [WEATHER, WEATHER]}, ("tools[1].name", "twice")),
        ({"tools": [{**WEATHER, "type": "bash_20250124"}]}, ("tools[0].type", "'bash_20250124'")),
        (
            {
                "tools": [
                    {**WEATHER, "input_schema": {"properties": {"a": {"not": {"pattern": "^x"}}}}}
                ],
                "tool_choice": {"type": "any"},
            },
            ("tools[0].input_schema", "'not'"),
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, ("tool_choice.name",)),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
            ("tool_choice.name", "'nope'"),
        ),
        ({"tool_choice": {"type": "auto", "name": "f"}}, ("tool_choice.name",)),
        ({"tool_choice": {"type": "sometimes"}}, ("tool_choice.type",)),
        (
            {"messages": [{"role": "user", "content": [CALLED["content"][1]]}]},  # type: ignore[index]
            ("messages[0].content[0].type", "'tool_use'", "user turn"),
        ),
        (
            {"messages": [ASK, {"role": "assistant", "content": RESULT["content"]}]},
            ("messages[1].content[0].type", "'tool_result'", "assistant turn"),
        ),
        (
            {
                "messages": [
                    ASK,
                    CALLED,
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "toolu_1",
                                "content": [{"type": "image"}],
                            }
                        ],
                    },
                ]
            },
            ("messages[2].content[0].content[0].type", "'image'"),
        ),
        (
            {"messages": [ASK, CALLED, {**RESULT, "content": [{"type": "tool_result"}]}]},
            ("messages[2].content[0].tool_use_id",),
        ),
        (
            {
                "tools": [WEATHER],
                "messages": [
                    ASK,
                    CALLED,
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}],
                    },
                ],
            },
            ("messages[2].content[0].tool_use_id", "'toolu_9'"),
        ),
        (
            {
                "messages": [
                    ASK,
                    {"role": "assistant", "content": [{**CALLED["content"][1], "input": "x"}]},  # type: ignore[index]
                ]
            },
            ("messages[1].content[0].input",),
        ),
        ({"tools": [WEATHER], "messages": [ASK, CALLED]}, ("messages[1].content", "tool_use")),
        # What Anthropic refuses too: a repeated tool_use id, a call of a tool not declared,
        # an empty content list anywhere but a final assistant turn.
        (
            {"tools": [WEATHER], "messages": [ASK, CALLED, RESULT, CALLED, RESULT]},
            ("messages[3].content[1].id", "'toolu_1'", "unique"),
        ),
        ({"messages": [ASK, CALLED, RESULT]}, ("messages[1].content[1].name", "'get_weather'")),
        (
            {"tools": [{**WEATHER, "name": "get_time"}], "messages": [ASK, CALLED, RESULT]},
            ("messages[1].content[1].name", "not in tools"),
        ),
        ({"messages": [ASK, {"role": "assistant", "content": []}, ASK]}, ("messages[1].content",)),
        ({"messages": [{"role": "user", "content": []}]}, ("messages[0].content", "non-empty")),
    ],
)
def test_tool_requests_refused_by_field(
    client: FlaskClient, change: dict[str, Any], named: tuple[str, ...]
) -> None:
    body = {"model": "late", "max_tokens": 8, "messages": [ASK], **change}
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        if route.endswith("count_tokens"):
            body.pop("max_tokens", None)
        refused(client.post(route, json=body), 400, "invalid_request_error", *named)


def test_the_conversation_is_rendered_as_the_openai_routes_render_it(settings: Settings) -> None:
    """Tools, an assistant's tool_use and the user's tool_result are the same turns the chat
    route hands the template: one prompt, whichever API the client speaks."""
    error = {**RESULT["content"][0], "is_error": True}  # type: ignore[index]
    messages = [ASK, CALLED, {**RESULT, "content": [error, {"type": "text", "text": "And?"}]}]
    body = {"model": "late", "max_tokens": 8, "tools": [WEATHER], "messages": messages}
    call = parse_messages(body, settings, messages_models(settings).create)
    chat = parse_chat_request(
        {
            "model": "late",
            "messages": [
                ASK,
                {
                    "role": "assistant",
                    "content": "Let me look.",
                    "tool_calls": [
                        {
                            "id": "toolu_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: sunny"},
                {"role": "user", "content": "And?"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": WEATHER["description"],
                        "parameters": WEATHER["input_schema"],
                    },
                }
            ],
        },
        settings,
    )
    assert call.prompt == chat.prompts[0]
    assert call.prompt.startswith("System: You can call these functions.")
    assert (
        'Assistant: Let me look.<tool_call>{"name": "get_weather", "arguments": {"city": '
        '"Paris"}}</tool_call>\nTool: Error: sunny\nUser: And?\nAssistant:'
    ) in call.prompt
    assert call.tools is not None and call.tools.parser == "hermes"
    # tool_choice none still shows the tools, and reads no calls.
    quiet = parse_messages(
        {**body, "tool_choice": {"type": "none"}}, settings, messages_models(settings).create
    )
    assert quiet.prompt == call.prompt and quiet.tools is not None and quiet.tools.parser is None


def drive(store: JobStore, job_id: str, texts: list[str], reason: FinishReason) -> None:
    """The job run the way a worker runs it: claimed, its tokens appended, finished."""
    claim = store.leases.claim(job_id, "a", time.time(), lease_ms=60_000, max_attempts=5)
    tokens = [TokenEvent(job_id, i, text, -0.5) for i, text in enumerate(texts)]
    pipe = store.redis.pipeline(transaction=False)
    store.queue_step(pipe, [StepAppend(job_id, claim.fence, tokens, time.time())])
    pipe.execute()
    output = "".join(texts)
    result = JobResult(JobStatus.SUCCEEDED, output, reason, len(texts), time.time())
    assert store.finish(job_id, claim.fence, result)


def answered(
    app: Flask, body: dict[str, Any], texts: list[str], reason: FinishReason = FinishReason.STOP
) -> dict[str, Any]:
    """The message ``POST /v1/messages`` answers once its job made ``texts``."""
    client, store = app.test_client(), store_of(app)
    key, answer = uuid.uuid4().hex, {}

    def post() -> None:
        reply = client.post("/v1/messages", json=body, headers={"Idempotency-Key": key})
        answer.update(reply.get_json(), status=reply.status_code)

    thread = threading.Thread(target=post)
    thread.start()
    record = wait_for(lambda: store.redis.get(keys.idempotency("", key)), 10, "the message's job")
    drive(store, json.loads(record)["job_ids"][0], texts, reason)
    thread.join(30)
    assert answer.pop("status") == 200, answer
    return answer


def test_a_call_is_a_tool_use_block_and_streams_as_anthropic_documents(app: Flask) -> None:
    client, store = app.test_client(), store_of(app)
    body = {"model": "late", "max_tokens": 16, "tools": [WEATHER], "messages": [ASK]}
    whole = answered(app, body, TEXTS)
    assert whole["stop_reason"] == "tool_use" and whole["stop_sequence"] is None
    text, use = whole["content"]
    assert text == {"type": "text", "text": "Let me check."}
    assert use["type"] == "tool_use" and use["id"].startswith("toolu_")
    assert use["id"] == tool_use_id("job_" + whole["id"].removeprefix("msg_"), 0)
    assert (use["name"], use["input"]) == ("get_weather", {"city": "Paris"})

    stream = {**body, "stream": True}
    headers = {"Idempotency-Key": uuid.uuid4().hex}
    head = Reader(client, stream, headers, stop_after=2).join()  # it drops after the head
    job_id = job_of(head)
    drive(store, job_id, TEXTS, FinishReason.STOP)
    events = Reader(client, stream, headers).join()
    kinds = [kind for _id, kind, _data in events]
    assert kinds[:2] == ["message_start", "ping"]
    assert kinds[2:5] == ["content_block_start", "content_block_delta", "content_block_delta"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
    starts = [data for _id, kind, data in events if kind == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use"]
    assert starts[1] == {
        "type": "content_block_start",
        "index": 1,
        "content_block": {
            "type": "tool_use",
            "id": tool_use_id(job_id, 0),  # the job's, as the whole message's is its job's
            "name": "get_weather",
            "input": {},
        },
    }
    deltas = [data["delta"] for _id, kind, data in events if kind == "content_block_delta"]
    fragments = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
    assert len(fragments) > 1  # the arguments stream as the model writes them
    assert json.loads("".join(fragments)) == {"city": "Paris"}
    assert "".join(d["text"] for d in deltas if d["type"] == "text_delta") == "Let me check."
    assert events[-2][2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2][2]["usage"]["output_tokens"] == len(TEXTS)
    assert "<" not in json.dumps([d.get("text", "") for d in deltas])  # never a tag as text

    # Resumed after any id: the head, the start of the block still open, then exactly the rest.
    ids = sorted({int(i) for i, _kind, _data in events if i is not None})
    reopened = 0
    for last in ids:
        rest = Reader(client, stream, {**headers, "Last-Event-ID": str(last)}).join()
        after = max(at for at, (i, *_) in enumerate(events) if i is not None and int(i) <= last)
        expected = events[after + 1 :]
        open_block = [e for e in rest[2:3] if e[1] == "content_block_start"]
        assert [e[1] for e in rest[:2]] == ["message_start", "ping"]
        assert rest[2 + len(open_block) :] == expected, last
        if open_block:
            assert open_block[0][1:] in [e[1:] for e in events[: after + 1]]
            reopened += 1
    assert 0 < reopened < len(ids)  # inside the text, inside the call, and after it


def test_choices_that_shape_the_answer(app: Flask) -> None:
    body = {"model": "late", "max_tokens": 16, "tools": [WEATHER], "messages": [ASK]}
    two = [CALL_TEXT.replace("get_time", "get_weather"), CALL_TEXT]
    calls = answered(app, body, two)["content"]
    assert [block["name"] for block in calls] == ["get_weather", "get_time"]
    assert calls[0]["id"] != calls[1]["id"] and calls[1]["input"] == {}
    one = {**body, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
    assert [block["name"] for block in answered(app, one, two)["content"]] == ["get_weather"]
    # none: the model saw the tools, but its answer is text, tags and all.
    plain = answered(app, {**body, "tool_choice": {"type": "none"}}, [CALL_TEXT])
    assert plain["content"] == [{"type": "text", "text": CALL_TEXT}]
    assert plain["stop_reason"] == "end_turn"
    # Cut short inside a call: the call as far as it came, and max_tokens says why.
    cut = answered(app, body, TEXTS[:5], FinishReason.LENGTH)
    assert cut["stop_reason"] == "max_tokens" and cut["content"][1]["type"] == "tool_use"
    # No text and no call: one empty text block, as a plain answer has.
    empty = answered(app, body, [" "])
    assert empty["content"] == [{"type": "text", "text": " "}]
