"""The restart policy's step-time table (pure logic)."""

from __future__ import annotations

import pytest

from worker.engine.step_times import SMOOTHING, StepTimes


def test_nothing_measured_gives_no_estimate() -> None:
    assert StepTimes().estimate(4) is None
    assert StepTimes({0: 1.0, 3: -1.0}).estimate(4) is None  # nonsense seeds are dropped


def test_interpolates_between_and_grows_linearly_past_the_largest() -> None:
    times = StepTimes({1: 0.002, 33: 0.010})
    assert times.estimate(1) == pytest.approx(0.002)
    assert times.estimate(17) == pytest.approx(0.006)  # halfway
    assert times.estimate(66) == pytest.approx(0.020)  # twice the largest measured size
    assert StepTimes({4: 0.003}).estimate(2) == pytest.approx(0.003)  # below: the smallest


def test_observations_refine_a_size_and_add_new_ones() -> None:
    times = StepTimes({1: 0.002, 33: 0.010})
    times.observe(33, 0.020)
    assert times.estimate(33) == pytest.approx(0.010 + SMOOTHING * 0.010)
    times.observe(9, 0.001)  # a new size splits the interpolation
    assert times.estimate(9) == pytest.approx(0.001)
    assert times.estimate(5) == pytest.approx(0.0015)
    times.observe(0, 5.0)
    times.observe(3, 0.0)
    assert times.estimate(3) == pytest.approx(0.00175)  # both ignored: no size, no time


def test_fixed_seeds_stand_when_learning_is_off() -> None:
    times = StepTimes({1: 0.002, 16: 0.004}, learn=False)
    times.observe(1, 0.050)
    times.observe(8, 0.050)
    assert times.estimate(1) == pytest.approx(0.002)
    assert times.estimate(8) == pytest.approx(0.002 + 7 / 15 * 0.002)
