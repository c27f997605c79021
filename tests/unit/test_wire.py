"""The token plane's wire forms: a text is JSON-encoded once, and every frame written from its
literal is byte for byte what encoding the decoded value again would give."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trickle.events import (
    DONE_MESSAGE,
    STATUS_MESSAGE,
    JobMessage,
    TokenEvent,
    TokenRun,
    encode_text,
    token_message,
)
from trickle.jobs import READ_FIELDS, FinishReason
from web.openai import responses as shapes
from web.streams.routes import tokens_sse, ws_frame

# Every code point but lone surrogates (a token's text is valid UTF-8), control characters,
# quotes, backslashes, U+2028 and the NUL that stands in for a template's text included.
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
logprobs = st.one_of(st.none(), st.floats(allow_nan=False), st.just(-math.inf))


@given(st.lists(st.tuples(texts, logprobs), min_size=1, max_size=12), st.integers(0, 10**6))
def test_a_token_message_decodes_to_exactly_what_was_sent(
    tokens: list[tuple[str, float | None]], first: int
) -> None:
    literals = [encode_text(text) for text, _ in tokens]
    raw = token_message(first, literals, [lp for _, lp in tokens])
    run = JobMessage.decode(raw).tokens
    assert run is not None and run.first == first and len(run) == len(tokens)
    assert [json.loads(literal) for literal in run.literals] == [text for text, _ in tokens]
    assert list(run.logprobs) == [lp for _, lp in tokens]
    assert run.text == "".join(text for text, _ in tokens)
    events = list(run.events("job_x"))
    assert events == [
        TokenEvent("job_x", first + i, text, lp) for i, (text, lp) in enumerate(tokens)
    ]


@given(texts)
def test_a_literal_is_what_json_dumps_writes(text: str) -> None:
    assert encode_text(text) == json.dumps(text, ensure_ascii=False)
    event = TokenEvent("job_x", 7, text, -0.5)
    assert event.to_log_entry() == json.dumps(
        {"index": 7, "text": text, "logprob": -0.5}, ensure_ascii=False
    )
    assert TokenEvent.from_log_entry("job_x", event.to_log_entry()) == event


@given(texts, texts)
def test_the_token_that_ended_a_job_says_so_in_the_log(text: str, stop: str) -> None:
    """What lets the next claim finalize a job whose worker died after its last token."""
    ended = TokenEvent("job_x", 3, text, -0.5, end=FinishReason.STOP, stop_sequence=stop)
    expected: dict[str, object] = {"index": 3, "text": text, "logprob": -0.5, "end": "stop"}
    if stop:
        expected["stop_sequence"] = stop
    assert ended.to_log_entry() == json.dumps(expected, ensure_ascii=False)
    assert TokenEvent.from_log_entry("job_x", ended.to_log_entry()) == ended
    by_length = TokenEvent("job_x", 4, text, None, (("a", -1.0),), FinishReason.LENGTH)
    assert json.loads(by_length.to_log_entry())["end"] == "length"
    assert TokenEvent.from_log_entry("job_x", by_length.to_log_entry()) == by_length


def test_signals_are_one_letter_and_never_tokens() -> None:
    assert JobMessage.decode(DONE_MESSAGE) == JobMessage(done=True)
    assert JobMessage.decode(STATUS_MESSAGE) == JobMessage(status_changed=True)


@given(st.lists(texts, min_size=1, max_size=6), st.integers(0, 5))
def test_runs_join_and_trim_without_decoding(parts: list[str], skip: int) -> None:
    events = [TokenEvent("job_x", 10 + i, text) for i, text in enumerate(parts)]
    halves = [TokenRun.from_events(part) for part in (events[:1], events[1:]) if part]
    whole = TokenRun.joined(halves)
    assert whole == TokenRun.from_events(events)
    assert json.loads(whole.text_literal()) == "".join(parts)
    start = min(10 + skip, whole.end - 1)
    assert list(whole.starting_at(start).events("job_x")) == events[start - 10 :]


@given(st.lists(texts, min_size=1, max_size=6))
def test_sse_and_websocket_frames_equal_json_dumps_of_the_decoded_tokens(parts: list[str]) -> None:
    events = [TokenEvent("job_x", 3 + i, text) for i, text in enumerate(parts)]
    run = TokenRun.from_events(events)
    assert tokens_sse(run) == "".join(
        f"id: {e.index}\nevent: token\ndata: {json.dumps(e.to_dict(), ensure_ascii=False)}\n\n"
        for e in events
    )
    frame = ws_frame(run)
    assert frame is not None
    assert json.loads(frame) == {
        "event": "token",
        "index": 3,
        "count": len(parts),
        "text": "".join(parts),
    }


@pytest.mark.parametrize("chat", [True, False])
@given(text=texts)
def test_a_chunk_from_its_template_is_the_chunk_json_dumps_writes(chat: bool, text: str) -> None:
    envelope = shapes.Envelope("cmpl-1", 1_700_000_000, "demo", ("job_a", "job_b"))
    rendered = shapes.text_chunk_template(envelope, 1, chat).render(encode_text(text))
    if chat:
        chunk = shapes.chat_chunk(envelope, 1, {"content": text})
    else:
        chunk = shapes.completion_chunk(envelope, 1, text)
    assert rendered == f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"


def test_a_record_message_that_cannot_be_read_is_a_bare_done() -> None:
    """A done message whose record is malformed, short or names no job still ends the job's
    readers; they read the job instead (the listener decoding it must not stop)."""
    running = ["job_1", "demo", '{"max_tokens": 1, "temperature": 0, "top_k": 1, "top_p": 1}']
    running += ["running"] + [False] * (len(READ_FIELDS) - 4)
    for payload in (
        "D",
        "Dnot json",
        "D[3]",
        'D[2, "x"]',
        "D[1" + ", false" * (len(READ_FIELDS) - 1) + "]",  # one field short
        "D" + json.dumps([0, *running]),  # not finished: readers must read on
    ):
        message = JobMessage.decode(payload)
        assert message.done and message.record is None
    finished = ["succeeded" if value == "running" else value for value in running]
    message = JobMessage.decode("D" + json.dumps([0, *finished]))
    assert message.record is not None and message.record.job.status.value == "succeeded"
