"""A worker's outlook, from the jobs it runs: their measured pace and expected lengths."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from trickle.jobs import FinishReason
from worker.in_flight import InFlight
from worker.length_ratios import LengthRatios
from worker.outlook import expected_tokens, model_outlook, seconds_per_token


def job(
    made: int,
    budget: int,
    first: float | None = None,
    last: float | None = None,
    started: bool = True,
    reason: FinishReason | None = None,
) -> Any:
    return SimpleNamespace(
        job_id="job_w" if not started else "job_r",
        generated_ids=[1] * made,
        request=SimpleNamespace(max_new_tokens=budget),
        first_token_at=first,
        last_token_at=last,
        batch_started_at=0.0 if started else None,
        state=SimpleNamespace(count=made, finish_reason=reason),
    )


def test_a_jobs_pace_is_measured_between_its_first_and_latest_token() -> None:
    assert seconds_per_token(job(11, 100, first=1.0, last=2.0)) == pytest.approx(0.1)
    assert seconds_per_token(job(1, 100, first=1.0, last=1.0)) is None
    assert seconds_per_token(job(5, 100)) is None


def test_expected_tokens_follow_the_length_ratio_within_the_budget() -> None:
    assert expected_tokens(job(10, 100), 1.0) == 90
    assert expected_tokens(job(10, 100), 0.3) == 20
    assert expected_tokens(job(40, 100), 0.3) == 1  # past its expected length: one more
    assert expected_tokens(job(100, 100), 0.3) == 0


def test_the_length_ratio_learns_from_jobs_that_ended_by_themselves() -> None:
    ratios = LengthRatios()
    assert ratios.ratio("demo") == 1.0
    ratios.finished("demo", job(25, 100, reason=FinishReason.STOP))
    assert ratios.ratio("demo") == pytest.approx(0.25)
    ratios.finished("demo", job(3, 100, reason=FinishReason.CANCELED))  # says nothing
    assert ratios.ratio("demo") == pytest.approx(0.25)
    ratios.finished("demo", job(100, 100, reason=FinishReason.LENGTH))
    assert 0.25 < ratios.ratio("demo") < 1.0


def test_a_model_outlook_frees_slots_after_running_then_claimed_jobs() -> None:
    running = job(11, 31, first=0.0, last=1.0)  # 0.1 s a token, 20 tokens left: 2 s
    waiting = job(0, 10, started=False)  # takes the free slot for 10 x 0.1 s
    outlook = model_outlook([running, waiting], 2, 1.0, lambda size: None, 50.0, 49.5)
    assert outlook.at == 50.0
    assert outlook.claims_through == 49.5  # its claims until then are among these jobs
    assert outlook.seconds_per_token == pytest.approx(0.1)
    assert outlook.free_in == pytest.approx((1.0, 2.0))
    assert outlook.claimed_waiting == (("job_w", 0.0),)  # claimed, starting on the free slot


def test_without_a_measured_job_the_step_time_is_the_pace() -> None:
    outlook = model_outlook([job(0, 10, started=False)], 1, 1.0, lambda size: 0.05, now=0.0)
    assert outlook.free_in == pytest.approx((0.5,))
    idle = model_outlook([], 2, 1.0, lambda size: None, now=0.0)
    assert idle.free_in == (0.0, 0.0) and idle.seconds_per_token == 0.0


def test_claims_through_moves_forward_only() -> None:
    """The claim thread and job threads both report claims, in any order: a late report of an
    older claim never takes back what a newer one said (jobs it covers would look unseen)."""
    in_flight = InFlight()
    assert in_flight.claims_through == 0.0
    in_flight.claims_seen(100.0)
    in_flight.claims_seen(99.0)
    assert in_flight.claims_through == 100.0
    in_flight.claims_seen(101.5)
    assert in_flight.claims_through == 101.5
