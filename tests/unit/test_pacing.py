"""The publisher's pacing rule (pure logic): the floor with few jobs, longer with many."""

from __future__ import annotations

import pytest

from worker.publisher import Pacing


def test_few_jobs_flush_at_the_floor() -> None:
    pacing = Pacing(0.010, 0.030, 1000)
    assert pacing.interval(0) == 0.010
    assert pacing.interval(10) == 0.010


def test_many_jobs_stretch_the_interval_to_the_message_budget_up_to_the_ceiling() -> None:
    pacing = Pacing(0.010, 0.030, 1000)
    assert pacing.interval(20) == pytest.approx(0.020)  # 20 jobs / 20 ms = 1,000 messages/s
    assert pacing.interval(25) == pytest.approx(0.025)
    assert pacing.interval(500) == 0.030


def test_no_budget_or_a_ceiling_below_the_floor_keeps_the_floor() -> None:
    assert Pacing(0.010, 0.030, 0).interval(500) == 0.010
    assert Pacing(0.010, 0.005, 1000).interval(500) == 0.010
    assert Pacing(0.0).interval(500) == 0.0
