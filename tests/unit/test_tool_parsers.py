"""The tool-call parsers as pure logic: every cut of the text gives the same answer, a partial
tag is never text, the name comes once and whole, the arguments come in order."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from web.common.tools.calls import ParsedAnswer, call_id, call_item_id, parse_answer
from web.common.tools.parser import CallArguments, CallEnd, CallStart, Event, Text
from web.common.tools.registry import make_parser

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}</tool_call>'
TWO = (
    'Let me look.\n<tool_call>\n{"name": "a", "arguments": {"x": [1, {"y": "}"}]}}\n</tool_call>\n'
    '<tool_call>{"name": "b\\u00e9", "arguments": {}}</tool_call>\n'
)


def run(name: str, pieces: list[str], max_calls: int | None = None) -> list[Event]:
    parser = make_parser(name, max_calls)
    events: list[Event] = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.finish()


def answer(events: list[Event]) -> ParsedAnswer:
    parsed = ParsedAnswer()
    parsed.add(events)
    return parsed


def cuts(text: str) -> list[list[str]]:
    """The text whole, one character at a time, and cut in two at every position."""
    return [[text], list(text), *([text[:i], text[i:]] for i in range(1, len(text)))]


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (CALL, "", [("get_weather", {"city": "Paris", "unit": "c"})]),
        (TWO, "Let me look.", [("a", {"x": [1, {"y": "}"}]}), ("bé", {})]),
        ("No tools here < > </tool_call> <tool", "No tools here < > </tool_call> <tool", []),
        ("plain answer\n\n", "plain answer\n\n", []),
        # Another key order or string arguments: read whole at the tag's end.
        (
            '<tool_call>{"arguments": {"q": 1}, "name": "s"}</tool_call>',
            "",
            [("s", {"q": 1})],
        ),
        (
            '<tool_call>{"name": "s", "arguments": "{\\"q\\": 2}"}</tool_call>',
            "",
            [("s", {"q": 2})],
        ),
        # Not a call object: text, tags and all.
        ("a <tool_call>nope</tool_call>", "a <tool_call>nope</tool_call>", []),
        # Unclosed at the end (the answer stopped before the closing tag): still a call.
        ('<tool_call>{"name": "f", "arguments": {"k": "v"}}', "", [("f", {"k": "v"})]),
        ('<tool_call>{"name": "f", "arguments": {"k": "v"}}</tool_', "", [("f", {"k": "v"})]),
        ("Done.\n<tool_call>", "Done.\n<tool_call>", []),
        ('<tool_call>{"name": 1}</tool', '<tool_call>{"name": 1}</tool', []),
    ],
)
def test_hermes_answer_is_the_same_for_every_cut(
    text: str, content: str, calls: list[tuple[str, object]]
) -> None:
    for pieces in cuts(text):
        parsed = answer(run("hermes", pieces))
        assert parsed.content == content, pieces
        assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls, pieces


def test_hermes_never_shows_a_partial_tag_and_sends_the_name_once_whole() -> None:
    for pieces in cuts("Hi " + CALL):
        events = run("hermes", pieces)
        texts = [e.text for e in events if isinstance(e, Text)]
        assert "".join(texts) == "Hi"
        assert all("<" not in t for t in texts)
        starts = [e for e in events if isinstance(e, CallStart)]
        assert starts == [CallStart(0, "get_weather")]
        # Name first, then the arguments in order, then the end.
        kinds = [type(e) for e in events if not isinstance(e, Text)]
        assert kinds[0] is CallStart and kinds[-1] is CallEnd
        assert set(kinds[1:-1]) <= {CallArguments}


def test_hermes_streams_arguments_before_the_call_ends() -> None:
    parser = make_parser("hermes")
    events = parser.feed('<tool_call>{"name": "f", "arguments": {"city": "Pa')
    assert events == [CallStart(0, "f"), CallArguments(0, '{"city": "Pa')]
    assert parser.feed('ris"}') == [CallArguments(0, 'ris"')]  # the brace may be the call's
    assert parser.feed("}") == []
    assert parser.feed("</tool_call>") == [CallArguments(0, "}"), CallEnd(0)]
    assert parser.finish() == []


def test_hermes_streamed_arguments_are_a_prefix_at_every_step() -> None:
    body = '{"name": "f", "arguments": {"a": "x<y", "b": {"c": "} }"}}}'
    text = f"<tool_call>{body}</tool_call>"
    final = json.dumps({"a": "x<y", "b": {"c": "} }"}})
    parser = make_parser("hermes")
    sent = ""
    for char in text:
        for event in parser.feed(char):
            if isinstance(event, CallArguments):
                sent += event.fragment
                assert final.startswith(sent)
    parser.finish()
    assert json.loads(sent) == json.loads(final)


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    for pieces in cuts(TWO):
        parsed = answer(run("hermes", pieces, max_calls=1))
        assert [c.name for c in parsed.calls] == ["a"]
        assert parsed.content == "Let me look."


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('{"name": "f", "arguments": {"a": 1}}', "", [("f", {"a": 1})]),
        (
            ' [{"name": "f", "parameters": {}}, {"name": "g", "arguments": {"b": [2]}}]',
            "",
            [
                ("f", {}),
                ("g", {"b": [2]}),
            ],
        ),
        ("Just text {not json}", "Just text {not json}", []),
        ('{"truncated": ', '{"truncated": ', []),
        ("[]", "[]", []),
        ("  spaced  ", "  spaced  ", []),
    ],
)
def test_json_answer_is_the_same_for_every_cut(
    text: str, content: str, calls: list[tuple[str, object]]
) -> None:
    for pieces in cuts(text):
        parsed = answer(run("json", pieces))
        assert parsed.content == content, pieces
        assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls, pieces


def test_parse_answer_and_ids_are_stable() -> None:
    parsed = parse_answer(make_parser("hermes"), CALL)
    assert parsed.calls[0].name == "get_weather"
    assert call_id("job_1", 0) == call_id("job_1", 0) != call_id("job_1", 1)
    assert call_id("job_1", 0).startswith("call_") and call_item_id("job_1", 0).startswith("fc_")


def test_unknown_parser_is_refused() -> None:
    with pytest.raises(ValueError, match="tool_call_parser"):
        make_parser("mistral")


def test_every_two_cut_points_give_the_same_answer() -> None:
    expected = answer(run("hermes", [CALL]))
    for i in range(1, len(CALL)):
        for j in range(i, len(CALL)):
            parsed = answer(run("hermes", [CALL[:i], CALL[i:j], CALL[j:]]))
            assert parsed == expected, (i, j)


names = st.from_regex(r"[a-zA-Z0-9_-]{1,12}", fullmatch=True)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
texts = st.text(min_size=1, max_size=20).map(str.strip).filter(lambda t: t and OPEN_TAG not in t)
OPEN_TAG = "<tool_call>"


@given(
    parts=st.lists(
        st.one_of(
            texts.map(lambda t: ("text", t)),
            st.tuples(names, st.dictionaries(st.text(max_size=6), values, max_size=3)).map(
                lambda c: ("call", c)
            ),
        ),
        max_size=5,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    spaced=st.booleans(),
)
def test_any_answer_cut_anywhere_reads_as_its_parts(
    parts: list[tuple[str, Any]], cuts: list[int], spaced: bool
) -> None:
    separator = "\n" if spaced else ""
    pieces, content, calls = [], "", []
    for kind, part in parts:
        if kind == "text":
            pieces.append(part)
            content += part
        else:
            name, arguments = part
            body = json.dumps({"name": name, "arguments": arguments}, indent=1 if spaced else None)
            pieces.append(
                f"{separator}<tool_call>{separator}{body}{separator}</tool_call>{separator}"
            )
            calls.append((name, arguments))
    text = "".join(pieces)
    points = sorted({c for c in cuts if 0 < c < len(text)})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    parsed = answer(run("hermes", chunks))
    if not calls:  # an answer without calls keeps its text exactly
        assert parsed.content == text
        return
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    # Whitespace that only separates calls is dropped; texts that follow a call lose their lead.
    assert parsed.content.replace("\n", "") == content.replace("\n", "")
