"""The queue-full check's count: a recent reading far below the limit, the broker near it."""

from __future__ import annotations

import threading
import time

import pytest

from web.admission.depth import AdmissionDepth


class Broker:
    """A queue whose depth the test sets; counts how often it is read."""

    def __init__(self) -> None:
        self.depth = 0
        self.reads = 0

    def read(self, model: str) -> int:
        self.reads += 1
        return self.depth


def test_far_below_the_limit_a_recent_reading_and_what_was_admitted_since_answer() -> None:
    broker, now = Broker(), [0.0]
    depth = AdmissionDepth(broker.read, max_age_seconds=0.5, headroom=0.5, clock=lambda: now[0])
    assert [depth.waiting("m", 100, 1) for _ in range(5)] == [0, 1, 2, 3, 4]
    assert broker.reads == 1
    broker.depth = 2  # a worker took some
    now[0] = 0.6  # the reading is stale: read again
    assert depth.waiting("m", 100, 1) == 2 and broker.reads == 2


def test_near_the_limit_every_check_reads_the_broker() -> None:
    broker = Broker()
    depth = AdmissionDepth(broker.read, max_age_seconds=60, headroom=0.5, clock=lambda: 0.0)
    broker.depth = 3
    assert depth.waiting("m", 10, 1) == 3  # first reading
    assert depth.waiting("m", 10, 1) == 4  # 4 + 1 <= 5: the estimate
    broker.depth = 9  # another web process filled the queue
    assert depth.waiting("m", 10, 1) == 9  # 5 + 1 > 5: read, exact
    assert depth.waiting("m", 10, 1) == 9 and broker.reads == 3  # still near: read again


def test_models_are_counted_apart() -> None:
    broker = Broker()
    depth = AdmissionDepth(broker.read, clock=lambda: 0.0)
    depth.waiting("a", 100, 10)
    assert depth.waiting("b", 100, 1) == 0 and broker.reads == 2


def test_a_burst_that_finds_the_reading_stale_reads_the_broker_once() -> None:
    broker, started, release = Broker(), threading.Event(), threading.Event()

    def slow_read(model: str) -> int:
        started.set()
        release.wait(5)
        return broker.read(model)

    depth = AdmissionDepth(slow_read, max_age_seconds=60, headroom=0.5, clock=lambda: 0.0)
    answers: list[int] = []
    first = threading.Thread(target=lambda: answers.append(depth.waiting("m", 100, 1)))
    first.start()
    assert started.wait(5)
    others = [
        threading.Thread(target=lambda: answers.append(depth.waiting("m", 100, 1)))
        for _ in range(4)
    ]
    for thread in others:
        thread.start()
    time.sleep(0.2)  # they arrive while the first reading is under way
    release.set()
    for thread in [first, *others]:
        thread.join(5)
    assert broker.reads == 1
    assert sorted(answers) == [0, 1, 2, 3, 4]  # each counts the ones admitted before it


def test_a_failed_reading_leaves_the_next_caller_to_read_again() -> None:
    calls = []

    def failing_then_fine(model: str) -> int:
        calls.append(model)
        if len(calls) == 1:
            raise ConnectionError("broker away")
        return 7

    depth = AdmissionDepth(failing_then_fine, clock=lambda: 0.0)
    with pytest.raises(ConnectionError):
        depth.waiting("m", 100, 1)
    assert depth.waiting("m", 100, 1) == 7 and len(calls) == 2
