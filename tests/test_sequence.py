"""SequenceState: released text, stop sequences, limits and cancellation, with a toy decoder."""

from __future__ import annotations

from worker.jobs import FinishReason
from worker.sequence import SequenceState

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
    return SequenceState(CharDecoder(), [], max_new_tokens, stop, EOS)


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
