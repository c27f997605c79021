"""When a worker sweeps the deadline index, and when it looks again: at the earliest deadline,
at a bounded rate, and every recovery interval regardless."""

from __future__ import annotations

import pytest

from trickle.store.deadlines import next_check_in, sweep_due

TICK, INTERVAL = 0.25, 2.0


def test_nothing_due_is_no_sweep_until_the_interval_passes() -> None:
    assert not sweep_due(100.0, None, 99.0, TICK, INTERVAL)
    assert not sweep_due(100.0, 100.5, 99.0, TICK, INTERVAL)  # the next one is still to come
    assert sweep_due(100.0, None, 98.0, TICK, INTERVAL)  # one whose entry was lost still ends


def test_a_deadline_that_came_is_swept_at_once() -> None:
    assert sweep_due(100.0, 100.0, 99.0, TICK, INTERVAL)
    assert sweep_due(100.0, 42.0, 0.0, TICK, INTERVAL)


def test_close_deadlines_are_swept_at_most_once_a_tick() -> None:
    assert not sweep_due(100.0, 99.99, 99.9, TICK, INTERVAL)
    assert sweep_due(100.0, 99.99, 99.75, TICK, INTERVAL)


def test_with_no_deadline_in_sight_it_looks_again_next_tick() -> None:
    assert next_check_in(100.0, None, 99.0, TICK) == TICK


def test_it_looks_again_at_the_earliest_deadline() -> None:
    assert next_check_in(100.0, 100.1, 99.0, TICK) == pytest.approx(0.1)
    assert next_check_in(100.0, 160.0, 99.0, TICK) == TICK  # a sooner one may be written


def test_a_deadline_just_after_a_sweep_waits_for_the_tick_since_it() -> None:
    assert next_check_in(100.0, 100.01, 99.9, TICK) == pytest.approx(0.15)
    assert next_check_in(100.0, 99.0, 99.9, TICK) == pytest.approx(0.15)  # due, swept soon


def test_it_never_waits_a_negative_time() -> None:
    assert next_check_in(100.0, 90.0, 50.0, TICK) == 0.0
