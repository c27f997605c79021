"""Seeded Poisson arrivals and the goodput figures of a run (pure logic)."""

from __future__ import annotations

import itertools
import statistics

import pytest

from bench.harness.arrivals import poisson_offsets
from bench.harness.engine_slots import ArrivedJob
from bench.harness.goodput import Goals, figures, goals_for


def test_the_same_seed_replays_the_same_arrivals_the_first_at_once() -> None:
    first = poisson_offsets(2.0, 50, seed=1)
    assert first == poisson_offsets(2.0, 50, seed=1)
    assert first != poisson_offsets(2.0, 50, seed=2)
    assert first[0] == 0.0
    assert all(later > earlier for earlier, later in itertools.pairwise(first))


def test_the_gaps_average_one_over_the_rate() -> None:
    offsets = poisson_offsets(4.0, 20_001, seed=3)
    gaps = [later - earlier for earlier, later in itertools.pairwise(offsets)]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.03)


def test_a_rate_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="rate must be positive"):
        poisson_offsets(0.0, 3, seed=1)


def job(index: int, arrived: float, first: float, gap: float, tokens: int) -> ArrivedJob:
    return ArrivedJob(index, arrived, arrived, [first + gap * n for n in range(tokens)])


def test_figures_count_a_job_as_good_only_when_it_met_both_goals() -> None:
    jobs = [
        job(0, 0.0, 0.100, 0.010, 11),  # TTFT 100 ms, gaps 10 ms: good
        job(1, 1.0, 1.400, 0.010, 11),  # TTFT 400 ms: too late
        job(2, 2.0, 2.050, 0.100, 11),  # gaps 100 ms: too slow
    ]
    row = figures(jobs, Goals(ttft_ms=250.0, itl_ms=80.0), capacity_per_s=1.0)
    assert row["good_jobs"] == 1
    assert row["good_share"] == pytest.approx(1 / 3)
    assert row["ttft_p50_ms"] == pytest.approx(100.0)
    assert row["itl_p99_ms"] == pytest.approx(100.0)
    span = 3.050  # first arrival at 0, last token at 2.05 + 10 x 0.1
    assert row["tokens_per_s"] == pytest.approx(33 / span)
    assert row["goodput_per_s"] == pytest.approx(1 / span)
    assert row["goodput_x_capacity"] == pytest.approx(1 / span)


def test_the_ttft_goal_loosens_at_half_of_capacity() -> None:
    assert goals_for(0.15) == Goals(250.0, 80.0)
    assert goals_for(0.3).ttft_ms == 250.0
    assert goals_for(0.5).ttft_ms == 500.0


def test_a_job_without_a_token_is_an_error_not_a_fast_one() -> None:
    with pytest.raises(ValueError, match="no token"):
        figures([ArrivedJob(7, 0.0)], goals_for(0.15), 1.0)
