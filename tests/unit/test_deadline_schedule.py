"""When a worker sweeps every shard's deadlines (each recovery interval), and when it looks
at the earliest deadline again: then, at a bounded rate."""

from __future__ import annotations

import pytest

from trickle.store.deadlines import next_check_in, sweep_due

TICK, INTERVAL = 0.25, 2.0


def test_every_shard_is_swept_once_the_interval_passes() -> None:
    assert not sweep_due(100.0, 99.0, INTERVAL)
    assert sweep_due(100.0, 98.0, INTERVAL)  # one whose entry was lost still ends
    assert sweep_due(100.0, 0.0, INTERVAL)


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
