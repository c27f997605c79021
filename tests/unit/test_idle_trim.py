"""When the engine gives its free heap back: once per idle spell, ``after`` seconds past the last
batch's end, never while a batch runs (the trim itself is counted, not run: pure timing)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from trickle.heap import IdleTrim

AFTER = 0.2


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Trims:
    def __init__(self) -> None:
        self.at: list[float] = []
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.at.append(time.monotonic())

    def count(self) -> int:
        with self.lock:
            return len(self.at)


def test_the_warm_up_is_given_back_once_the_engine_idles() -> None:
    trims = Trims()
    IdleTrim(AFTER, trims)
    wait_for(lambda: trims.count() == 1, 5, "the first trim")
    time.sleep(3 * AFTER)
    assert trims.count() == 1  # once per spell, not every ``after``


def test_no_trim_while_a_batch_runs_and_one_after_it_ends() -> None:
    trims = Trims()
    trim = IdleTrim(AFTER, trims)
    wait_for(lambda: trims.count() == 1, 5, "the first trim")
    trim.begin()
    time.sleep(3 * AFTER)
    assert trims.count() == 1, "trimmed under a running batch"
    ended = time.monotonic()
    trim.end()
    wait_for(lambda: trims.count() == 2, 5, "the trim after the batch")
    assert trims.at[1] - ended >= AFTER * 0.9


def test_batches_closer_than_the_spell_keep_their_pages() -> None:
    """Steady traffic with short gaps between batches: nothing is trimmed until it stops."""
    trims = Trims()
    trim = IdleTrim(AFTER, trims)
    wait_for(lambda: trims.count() == 1, 5, "the first trim")
    for _ in range(8):
        trim.begin()
        time.sleep(AFTER / 8)
        trim.end()
        time.sleep(AFTER / 4)
    assert trims.count() == 1
    wait_for(lambda: trims.count() == 2, 5, "the trim once traffic stopped")


def test_two_lanes_one_still_running_is_not_idle() -> None:
    trims = Trims()
    trim = IdleTrim(AFTER, trims)
    wait_for(lambda: trims.count() == 1, 5, "the first trim")
    trim.begin()
    trim.begin()
    trim.end()  # one lane done, the other still decoding
    time.sleep(3 * AFTER)
    assert trims.count() == 1
    trim.end()
    wait_for(lambda: trims.count() == 2, 5, "the trim once both lanes ended")


def test_a_trim_that_raises_leaves_the_next_spell_its_trim() -> None:
    calls: list[float] = []

    def failing_once() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("the first trim fails")

    trim = IdleTrim(AFTER, failing_once)
    wait_for(lambda: len(calls) == 1, 5, "the failing trim")
    trim.note()
    wait_for(lambda: len(calls) == 2, 5, "the trim of the next idle spell")
