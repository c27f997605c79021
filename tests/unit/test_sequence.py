"""SequenceState: released text, stop sequences, limits and cancellation, with a toy decoder."""

from __future__ import annotations

from trickle.jobs import FinishReason, JobError
from worker.engine.scheduled import TokenOutcome
from worker.engine.sequence import SequenceState

EOS = 0


class CharDecoder:
    """Id n decodes to chr(n): enough to test the bookkeeping without a real tokenizer."""

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids if i != EOS)


def run(
    state: SequenceState, text: str, eos: bool = False, ends: bool = True
) -> list[tuple[int | None, str]]:
    """Feed text as tokens; ``ends`` marks the last one as the engine's final step."""
    ids = [ord(c) for c in text] + ([EOS] if eos else [])
    events = []
    for position, token_id in enumerate(ids):
        outcome = state.on_token(token_id, is_last=ends and position == len(ids) - 1)
        events.append((outcome.index, outcome.text))
        if outcome.finish_reason is not None:
            break
    return events


def make(max_new_tokens: int = 100, stop: tuple[str, ...] = ()) -> SequenceState:
    return SequenceState(CharDecoder(), [], max_new_tokens, stop, {EOS})


def test_length_limit_counts_tokens_and_releases_everything() -> None:
    state = make(max_new_tokens=3)
    events = run(state, "abcdef")
    assert events == [(0, "a"), (1, "b"), (2, "c")]
    assert state.finish_reason is FinishReason.LENGTH
    assert state.output == "abc" and state.count == 3


def test_stop_sequence_across_tokens_is_withheld() -> None:
    state = make(stop=("cd",))
    events = run(state, "abcdef")
    assert "".join(text for _, text in events) == "ab" == state.output
    assert state.finish_reason is FinishReason.STOP
    assert [index for index, _ in events] == [0, 1, 2, 3]


def test_end_of_sequence_counts_as_a_token_and_flushes_held_text() -> None:
    state = make(stop=("xyz",))
    events = run(state, "abx", eos=True)
    assert events[-1] == (3, "x")
    assert state.output == "abx"
    assert state.finish_reason is FinishReason.STOP


def test_cancel_ends_before_the_next_token() -> None:
    state = make()
    run(state, "ab", ends=False)
    state.request_stop(FinishReason.CANCELED)
    outcome = state.on_token(ord("c"), is_last=False)
    assert outcome.index is None and outcome.finish_reason is FinishReason.CANCELED
    assert state.output == "ab"


def test_tokens_after_the_end_change_nothing() -> None:
    state = make(max_new_tokens=2)
    run(state, "ab")
    after = state.on_token(ord("c"), is_last=False)
    assert after == TokenOutcome(None, "", FinishReason.LENGTH)
    assert state.output == "ab" and state.count == 2 and state.finished


def test_stop_request_reports_its_reason_and_error_and_the_first_one_wins() -> None:
    state = make()
    assert state.stop_requested is None and not state.finished
    error = JobError("deadline_exceeded", "too long")
    state.request_stop(FinishReason.ERROR, error)
    state.request_stop(FinishReason.CANCELED)  # later requests do not override the first
    assert state.stop_requested is FinishReason.ERROR and state.error is error
    outcome = state.on_token(ord("a"), is_last=False)
    assert outcome == TokenOutcome(None, "", FinishReason.ERROR)
    assert state.finish_reason is FinishReason.ERROR and state.count == 0


def test_is_last_releases_held_text_and_ends_as_length() -> None:
    state = make(stop=("xyz",))
    events = run(state, "abx")  # the engine's last step: the held "x" is released
    assert events == [(0, "a"), (1, "b"), (2, "x")]
    assert state.finish_reason is FinishReason.LENGTH and state.output == "abx"


def test_a_stop_completed_by_the_final_flush_still_ends_as_stop() -> None:
    # The detokenizer holds an incomplete character (U+FFFD) until the end; flushed, it
    # completes the stop, so the job still ends as stop and the stop text is not released.
    state = make(stop=("a\ufffd",))
    assert state.on_token(ord("a"), is_last=False).text == ""  # could start the stop: held
    last = state.on_token(0xFFFD, is_last=True)
    assert last == TokenOutcome(1, "", FinishReason.STOP)
    assert state.output == "" and state.finish_reason is FinishReason.STOP


def test_resumed_state_continues_indexes_and_output() -> None:
    state = SequenceState(CharDecoder(), [ord("x")], 5, (), {EOS}, "xyz", 3)
    events = run(state, "ab")
    assert events == [(3, "a"), (4, "b")]
    assert state.output == "xyzab" and state.count == 5
    assert state.finish_reason is FinishReason.LENGTH


def test_resumed_state_with_nothing_left_ends_at_once() -> None:
    state = SequenceState(CharDecoder(), [ord("x")], 3, (), {EOS}, "xyz", 3)
    outcome = state.on_token(ord("a"), is_last=False)
    assert outcome.finish_reason is FinishReason.LENGTH


def test_finish_without_token_keeps_an_earlier_reason() -> None:
    state = make()
    state.finish_without_token(FinishReason.ERROR)
    assert state.finish_reason is FinishReason.ERROR and state.finished
    state.finish_without_token(FinishReason.CANCELED)
    assert state.finish_reason is FinishReason.ERROR
    ended = make(max_new_tokens=1)
    run(ended, "a")
    ended.finish_without_token(FinishReason.CANCELED)
    assert ended.finish_reason is FinishReason.LENGTH


def test_end_of_sequence_without_stops_ends_as_stop_with_its_index() -> None:
    state = make()
    events = run(state, "ab", eos=True, ends=False)
    assert events == [(0, "a"), (1, "b"), (2, "")]
    assert state.finish_reason is FinishReason.STOP and state.count == 3


def test_every_end_id_ends_the_job_and_none_is_emitted() -> None:
    """A model's extra end tokens (generation_config.json) and a job's stop_token_ids."""
    for end in (EOS, ord("#")):
        state = SequenceState(CharDecoder(), [], 100, (), {EOS, ord("#")})
        assert run(state, "ab#cd" if end != EOS else "ab", eos=end == EOS) == [
            (0, "a"),
            (1, "b"),
            (2, ""),
        ]
        assert state.finish_reason is FinishReason.STOP and state.output == "ab"


def test_the_stop_string_that_ended_it_is_kept() -> None:
    state = make(stop=("!", "END"))
    run(state, "abENDx!")
    assert state.finish_reason is FinishReason.STOP and state.stop_sequence == "END"
    completed_by_flush = make(max_new_tokens=5, stop=("cd",))
    run(completed_by_flush, "abcd")
    assert completed_by_flush.stop_sequence == "cd"
    for other in (make(max_new_tokens=2, stop=("z",)), make(stop=("z",))):
        run(other, "abc", eos=True)
        assert other.stop_sequence == ""
