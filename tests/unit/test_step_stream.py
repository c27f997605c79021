"""What the engine process sends the worker (pure logic): complete decoding steps, together
while they come fast, with a sequence's first tokens and its end sent at once."""

from __future__ import annotations

import itertools
import time
from typing import Any

from worker.engine.batch_command import BatchCommand
from worker.engine.step_stream import StepStream

HOLD_EVERYTHING = 3600.0  # a coalescing window no test reaches: only urgency sends


def command(prompt_lengths: list[int], max_new: list[int]) -> BatchCommand:
    return BatchCommand(
        batch_id=7,
        prompts=[["▁x"] * length for length in prompt_lengths],
        max_new_tokens=max_new,
        slots=list(range(len(prompt_lengths))),
        temperature=1.0,
        top_k=1,
        top_p=1.0,
        repetition_penalty=1.0,
        ignore_eos=True,
    )


def stream_of(
    cmd: BatchCommand, coalesce: float, flags: bytearray | None = None
) -> tuple[StepStream, list[tuple[Any, ...]]]:
    sent: list[tuple[Any, ...]] = []
    flags = flags if flags is not None else bytearray(len(cmd.slots))
    return StepStream(cmd, memoryview(flags), sent.append, coalesce), sent


def steps_of(message: tuple[Any, ...]) -> list[int]:
    kind, batch_id, steps = message
    assert (kind, batch_id) == ("steps", 7)
    return [tokens[0][1] for _, tokens in steps]


def test_first_tokens_go_at_once_then_steps_wait_for_the_end() -> None:
    stream, sent = stream_of(command([3], [10]), HOLD_EVERYTHING)
    for step in range(10):
        stream.token(0, step, 100 + step, None, False)
        if step < 2:
            assert len(sent) == step + 1  # the first two tokens, each alone
    assert [steps_of(m) for m in sent] == [[0], [1], list(range(2, 10))]  # the end sent the rest
    last_step = sent[-1][2][-1][1][0]
    assert last_step == (0, 9, 109, None, True)  # the limit is marked where it was reached


def test_without_a_window_every_step_goes_alone() -> None:
    stream, sent = stream_of(command([3], [5]), 0.0)
    for step in range(5):
        stream.token(0, step, step, None, False)
    assert [steps_of(m) for m in sent] == [[0], [1], [2], [3], [4]]


def test_held_steps_go_once_the_window_passed() -> None:
    stream, sent = stream_of(command([3], [100]), 0.005)
    for step in range(3):
        stream.token(0, step, step, None, False)  # 0, 1 at once; 2 held (2 ms since)
    assert [steps_of(m) for m in sent] == [[0], [1]]
    time.sleep(0.01)
    stream.token(0, 3, 3, None, False)
    assert [steps_of(m) for m in sent] == [[0], [1], [2, 3]]


def test_each_step_keeps_its_own_start_time() -> None:
    stream, sent = stream_of(command([3], [6]), HOLD_EVERYTHING)
    before = time.monotonic()
    for step in range(6):
        stream.token(0, step, step, None, False)
        time.sleep(0.002)
    starts = [started for message in sent for started, _ in message[2]]
    assert len(starts) == 6 and starts[0] >= before
    assert all(later - earlier >= 0.0015 for earlier, later in itertools.pairwise(starts))


def test_a_later_starting_sequence_and_an_early_end_lose_nothing() -> None:
    """Sequence 1's prompt is two tokens longer: it speaks from step 2 on. Sequence 0 ends at
    its 4th token (urgent: sent at once); every token arrives once, in order."""
    stream, sent = stream_of(command([3, 5], [4, 6]), HOLD_EVERYTHING)
    expected = []
    for step in range(8):
        for position in (0, 1):
            first = (0, 2)[position]
            count = step - first + 1
            if first <= step and count <= (4, 6)[position]:
                stopped = stream.token(position, step, 10 * position + count, None, False)
                assert stopped == (count == (4, 6)[position])
                expected.append((position, step))
    received = [(p, s) for message in sent for _, tokens in message[2] for p, s, *_ in tokens]
    assert received == expected
    assert [steps_of(m) for m in sent] == [[0], [1], [2], [3], [4, 5, 6, 7]]


def test_a_sequence_the_worker_stopped_sends_nothing_more() -> None:
    flags = bytearray(1)
    stream, sent = stream_of(command([3], [10]), 0.0, flags)
    stream.token(0, 0, 1, None, False)
    flags[0] = 1
    assert stream.token(0, 1, 2, None, False) is True  # stopped, its token dropped
    stream.flush()
    assert [steps_of(m) for m in sent] == [[0]]
