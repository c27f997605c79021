"""Responses events of a tool answer: numbered without a gap, the same whatever tokens the text
came in, and adding up to the items the stored output gives; a stored record keeps the turns'
calls for the next response."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from trickle.jobs import FinishReason, Job, JobStatus
from trickle.params import GenerationParams
from web.common.chat_template import ChatTurn, TurnCall
from web.common.tools.registry import make_parser
from web.openai.responses_api.store import StoredResponse
from web.openai.responses_api.tool_events import ToolEvents, read_whole

RECORD = StoredResponse(
    id="resp_" + "b" * 32,
    job_id="job_" + "b" * 32,
    tenant_digest="",
    model="demo",
    created_at=1,
    messages=(ChatTurn("user", "weather?"),),
    tools=({"type": "function", "name": "get_weather", "parameters": None, "strict": False},),
    tool_parser="hermes",
)
OUTPUT = (
    'Checking:\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>\nDone.'
)


def finished(output: str, reason: FinishReason = FinishReason.STOP) -> Job:
    job = Job(RECORD.job_id, "demo", "p", GenerationParams(), status=JobStatus.SUCCEEDED)
    job.output, job.finish_reason = output, reason
    return job


def stream(record: StoredResponse, job: Job, tokens: list[str]) -> list[dict[str, Any]]:
    events = ToolEvents(record, make_parser("hermes"))
    made = events.head()
    for token in tokens:
        made += events.token(token)
    return made + events.end(job)


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(OUTPUT)])
def test_events_are_numbered_and_the_same_for_every_cut(size: int) -> None:
    job = finished(OUTPUT)
    tokens = [OUTPUT[i : i + size] for i in range(0, len(OUTPUT), size)]
    events = stream(RECORD, job, tokens)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]
    assert final["type"] == "response.completed"
    output = final["response"]["output"]
    assert [item["type"] for item in output] == [
        "message",
        "function_call",
        "function_call",
        "message",
    ]
    assert output == read_whole(RECORD, make_parser("hermes"), job).items
    assert output[0]["content"][0]["text"] == "Checking:"
    assert output[3]["content"][0]["text"] == "Done."
    assert output[0]["id"] != output[3]["id"]
    for index in (1, 2):
        item = output[index]
        deltas = "".join(
            e["delta"]
            for e in events
            if e["type"] == "response.function_call_arguments.delta" and e["output_index"] == index
        )
        assert deltas == item["arguments"] and item["status"] == "completed"
    # The events carry nothing else: the one-character cut shows no tag as text.
    texts = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert "<" not in "".join(texts)


def test_a_cut_answer_leaves_its_open_call_incomplete() -> None:
    cut = '<tool_call>{"name": "get_weather", "arguments": {"city": "Os'
    events = stream(RECORD, finished(cut, FinishReason.LENGTH), [cut])
    assert events[-1]["type"] == "response.incomplete"
    (item,) = events[-1]["response"]["output"]
    assert item["status"] == "incomplete" and item["arguments"] == '{"city": "Os'


def test_the_record_keeps_calls_and_results_across_a_round_trip() -> None:
    turns = (
        ChatTurn("user", "weather?"),
        ChatTurn("assistant", "", (TurnCall("call_1", "get_weather", '{"city": "Oslo"}'),)),
        ChatTurn("tool", "sunny", tool_call_id="call_1"),
    )
    record = dataclasses.replace(RECORD, messages=turns, parallel_tool_calls=False)
    again = StoredResponse.from_json(record.to_json())
    assert again == record
    tools = again.tool_use()
    assert tools is not None and tools.parser == "hermes" and tools.max_calls == 1
    assert tools.definitions[0]["function"]["name"] == "get_weather"
