"""Tools on the Messages API end to end: a real worker serves the model that calls tools on cue
(``tests.tool_model``), and the official ``anthropic`` client runs its tool loop against it
(``tool_use`` -> ``tool_result`` -> the final text), whole and streamed; the streamed blocks,
assembled by the client's own stream helper, equal the whole message's."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.faultstack import FaultStack
from tests.tool_model import ANSWER_TEXT

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME: Any = {"name": "get_time", "input_schema": {"type": "object"}}
ASK: Any = {"role": "user", "content": "What is the weather in Paris?"}
BLOCK_EVENTS = ("content_block_start", "content_block_delta", "content_block_stop")


@pytest.fixture(scope="module")
def client(tool_stack: FaultStack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=tool_stack.web_url, api_key="x", max_retries=0)


def create(client: anthropic.Anthropic, streamed: bool, **args: Any) -> Any:
    """The message, whole or assembled by the client's stream helper; a stream's event
    sequence is checked on the way."""
    args = {"model": "tools", "max_tokens": 32, "extra_body": {"temperature": 0}, **args}
    if not streamed:
        return client.messages.create(**args)
    kinds: list[str] = []
    with client.messages.stream(**args) as stream:
        for event in stream:
            if event.type in ("message_start", "message_delta", "message_stop", *BLOCK_EVENTS):
                kinds.append(event.type)
        message = stream.get_final_message()
    blocks = [kind for kind in kinds if kind in BLOCK_EVENTS]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    # Each block: a start, its deltas, its stop, one after another.
    assert blocks.count("content_block_start") == len(message.content)
    for start in (at for at, kind in enumerate(blocks) if kind == "content_block_start"):
        rest = blocks[start + 1 :]
        stop = rest.index("content_block_stop")
        assert set(rest[:stop]) <= {"content_block_delta"}
    return message


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_the_anthropic_clients_tool_loop(client: anthropic.Anthropic, streamed: bool) -> None:
    messages: list[Any] = [ASK]
    first = create(client, streamed, tools=[WEATHER], messages=messages)
    assert first.stop_reason == "tool_use" and first.stop_sequence is None
    (use,) = first.content
    assert use.type == "tool_use" and use.id.startswith("toolu_")
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})

    messages.append({"role": "assistant", "content": first.content})
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 22C"}
    messages.append({"role": "user", "content": [result]})
    final = create(client, streamed, tools=[WEATHER], messages=messages)
    assert final.stop_reason == "end_turn"
    assert [block.type for block in final.content] == ["text"]
    assert final.content[0].text == ANSWER_TEXT
    # count_tokens sees the same conversation, tools and results included.
    tokens = client.messages.count_tokens(model="tools", tools=[WEATHER], messages=messages)
    assert tokens.input_tokens == final.usage.input_tokens


def test_text_and_two_calls_streamed_equal_the_whole_message(client: anthropic.Anthropic) -> None:
    args: Any = {"tools": [WEATHER, TIME], "messages": [{"role": "user", "content": "two?"}]}
    whole = create(client, False, **args)
    streamed = create(client, True, **args)
    assert [block.type for block in whole.content] == ["text", "tool_use", "tool_use"]
    assert whole.content[0].text == "Checking:"
    assert [(b.name, b.input) for b in whole.content[1:]] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {"zone": "CET"}),
    ]
    assert whole.stop_reason == streamed.stop_reason == "tool_use"
    # Two answers, two jobs: the same blocks but for the ids, which are each job's.
    assert [b.model_dump(exclude={"id"}) for b in streamed.content] == [
        b.model_dump(exclude={"id"}) for b in whole.content
    ]
    one = create(
        client,
        True,
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        **args,
    )
    assert [block.type for block in one.content] == ["text", "tool_use"]


def test_a_choice_naming_an_absent_tool_is_refused_and_none_reads_no_calls(
    client: anthropic.Anthropic,
) -> None:
    for choice in ({"type": "tool", "name": "absent"}, {"type": "any"}):
        tools = [WEATHER] if choice["type"] == "tool" else []
        with pytest.raises(anthropic.BadRequestError) as refused:
            create(client, False, tools=tools, tool_choice=choice, messages=[ASK])
        error = refused.value.body["error"]  # type: ignore[index]
        assert error["type"] == "invalid_request_error" and "tool_choice" in error["message"]
    plain = create(client, True, tools=[WEATHER], tool_choice={"type": "none"}, messages=[ASK])
    assert [block.type for block in plain.content] == ["text"]
    assert plain.content[0].text.startswith("<tool_call>") and plain.stop_reason == "end_turn"
