"""The sharing gate (pure logic): the refusal-rate estimate, the break-even rate from the cost
model, and the decision ``policy.alone`` and ``batches_with`` then follow."""

from __future__ import annotations

import math

import pytest

from worker.engine.policy import alone, batches_with
from worker.engine.request import EngineRequest, SamplingKey
from worker.engine.scheduled import ScheduledJob
from worker.engine.sharing_gate import RefusalRate, SharingGate, break_even_rate
from worker.engine.step_times import StepTimes

GREEDY = SamplingKey(1.0, 1, 1.0, 1.0, False)
# A CPU-like model: 2.5 ms a step alone, 4.6 ms at 16 rows, 20 µs per prefilled token.
STEPS = {1: 0.0025, 16: 0.0046}
PREFILL = 0.00002


def request(grammar: str | None = "start: /[a-z]+/", top_logprobs: int = 0) -> EngineRequest:
    return EngineRequest(
        list(range(1, 21)), 60, GREEDY, grammar=grammar, top_logprobs=top_logprobs
    )  # 20 prompt tokens + 60 / 2: priced at 50 tokens


def gate(refusals: RefusalRate, steps: dict[int, float] | None = None) -> SharingGate:
    return SharingGate(refusals, StepTimes(STEPS if steps is None else steps), PREFILL, 16)


def test_the_estimate_starts_at_zero_and_reads_refusals_per_proposed_token() -> None:
    rate = RefusalRate()
    assert rate.rate == 0.0
    rate.observe(100, 20)
    assert rate.rate == pytest.approx(0.2)
    rate.observe(0, 5)  # nothing proposed: nothing learned
    assert rate.rate == pytest.approx(0.2)


def test_the_estimate_forgets_old_batches_by_tokens() -> None:
    rate = RefusalRate(half_life_tokens=100)
    rate.observe(100, 50)
    rate.observe(1000, 0)  # ten half-lives of clean tokens
    assert rate.rate < 0.001
    rate.observe(100, 50)  # the clean tokens weigh half as much after a half-life more
    assert rate.rate == pytest.approx(50 / (1000 * 0.5 + 100), rel=0.01)


def test_break_even_follows_the_cost_model() -> None:
    # (s1 - s16 / 16) / (15 * L * p) = (2.5 ms - 0.2875 ms) / (15 * 50 * 20 µs)
    expected = (0.0025 - 0.0046 / 16) / (15 * 50 * PREFILL)
    assert break_even_rate(0.0025, 0.0046, 16, 50, PREFILL) == pytest.approx(expected)
    # Longer rows cost more per restart: they share only at fewer refusals.
    assert break_even_rate(0.0025, 0.0046, 16, 500, PREFILL) == pytest.approx(expected / 10)


def test_break_even_at_the_edges() -> None:
    assert break_even_rate(0.0025, 0.0046, 1, 50, PREFILL) == 0.0  # one row shares nothing
    assert break_even_rate(0.002, 0.040, 16, 50, PREFILL) == 0.0  # no step saved
    assert break_even_rate(0.0025, 0.0046, 16, 50, 0.0) == math.inf  # free restarts


def test_constrained_jobs_share_until_the_model_refuses_past_break_even() -> None:
    refusals = RefusalRate()
    sharing = gate(refusals)
    job = request()
    threshold = sharing.break_even(job)
    assert 0.1 < threshold < 0.2  # ~0.147 at these prices
    assert sharing.shares(job)  # optimistic: nothing refused yet
    refusals.observe(1000, round(1000 * threshold * 0.8))
    assert sharing.shares(job)
    refusals.observe(10_000, 2000)  # the demo model's one in five
    assert not sharing.shares(job)
    # The estimate keeps learning from jobs run alone: a model that stops refusing recovers.
    refusals.observe(20_000, 0)
    assert sharing.shares(job)


def test_alternatives_only_jobs_always_share() -> None:
    refusals = RefusalRate()
    refusals.observe(100, 100)
    assert gate(refusals).shares(request(grammar=None, top_logprobs=3))


def test_nothing_measured_yet_shares() -> None:
    refusals = RefusalRate()
    refusals.observe(100, 90)
    assert gate(refusals, steps={}).shares(request())


def test_a_job_the_gate_holds_back_runs_alone_in_every_batching_rule() -> None:
    refusals = RefusalRate()
    refusals.observe(1000, 200)
    sharing = gate(refusals)
    held = sharing.decided(request())
    assert held.shares_calls is False and alone(held)
    other = ScheduledJob("b", "", sharing.decided(request()), None)  # type: ignore[arg-type]
    assert not batches_with(other, held)
    # Alternatives-only jobs pass through unchanged and still batch with each other.
    plain = request(grammar=None, top_logprobs=2)
    assert sharing.decided(plain) is plain and not alone(plain)
    assert batches_with(ScheduledJob("c", "", plain, None), plain)  # type: ignore[arg-type]
    # Optimistic again: a request goes through untouched, and one held back before is freed.
    fresh = gate(RefusalRate())
    job = request()
    assert fresh.decided(job) is job and not alone(job)
    assert fresh.decided(held).shares_calls and not alone(fresh.decided(held))
