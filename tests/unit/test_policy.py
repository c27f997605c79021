"""The restart policy's decisions (pure logic over batch state, the demo model's tokenizer for
the jobs' sequence state): which batch a newcomer joins, and when a batch is split."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from trickle.params import GenerationParams
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer
from worker.engine.batch import RunningBatch
from worker.engine.new_job import make_scheduled_job
from worker.engine.policy import RestartPolicy, RestartRules, halves, restart_fill
from worker.engine.request import EngineRequest
from worker.engine.scheduled import ScheduledJob
from worker.engine.step_times import StepTimes

# A CPU-like model: a step grows with the batch (1: 2 ms, 16: 12 ms); prompts prefill fast.
STEPS = {1: 0.002, 16: 0.012}
RULES = RestartRules(16, max_stall=0.04, wait_ratio=4.0, split_gain_ratio=3.0,
                     prefill_seconds_per_token=0.0001)  # fmt: skip


@dataclass
class Holder:
    """What make_scheduled_job reads from an engine."""

    tokenizer: SentencePieceTokenizer
    eos_id: int

    def stop_ids(self, params: GenerationParams) -> frozenset[int]:
        return frozenset(() if params.ignore_eos else (self.eos_id,))


@pytest.fixture(scope="module")
def holder(demo_model_dir: Path) -> Holder:
    tokenizer = SentencePieceTokenizer(str(demo_model_dir / "tokenizer.model"), add_bos=True)
    return Holder(tokenizer, tokenizer.eos_id)


def job(holder: Holder, generated: int, max_tokens: int = 128, **params: object) -> ScheduledJob:
    options = GenerationParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, **params)  # type: ignore[arg-type]
    scheduled = make_scheduled_job(holder, "j", holder.tokenizer.encode("The"), options, "f")  # type: ignore[arg-type]
    scheduled.generated_ids = [5] * generated
    return scheduled


def running(jobs: list[ScheduledJob], steps: int = 10) -> RunningBatch:
    requests: list[EngineRequest] = [j.current_request() for j in jobs]
    batch = RunningBatch(jobs, requests, steps=steps)
    batch.step_seconds = 0.005
    return batch


def policy() -> RestartPolicy:
    return RestartPolicy(RULES, StepTimes(STEPS))


def test_a_long_batch_with_most_of_its_steps_ahead_is_split(holder: Holder) -> None:
    batch = running([job(holder, 5) for _ in range(8)])
    split = policy().split([batch], now=0.0)
    assert split is not None and split.batch is batch and not split.long


def test_a_batch_near_its_end_is_not_split(holder: Holder) -> None:
    batch = running([job(holder, 125) for _ in range(8)])
    assert policy().split([batch], now=0.0) is None


def test_a_batch_that_cannot_be_restarted_is_never_split(holder: Holder) -> None:
    penalised = running([job(holder, 5, repetition_penalty=1.3) for _ in range(8)])
    lone = running([job(holder, 5)])
    assert policy().split([penalised, lone], now=0.0) is None


def test_halves_keep_the_longer_sequences_together(holder: Holder) -> None:
    jobs = [job(holder, generated) for generated in (3, 40, 5, 38)]
    keep, give = halves(jobs)
    assert sorted(j.total_length() for j in keep) == sorted(jobs[i].total_length() for i in (1, 3))
    assert len(give) == 2


def test_a_newcomer_joins_the_batch_that_is_smaller_with_it(holder: Holder) -> None:
    big = running([job(holder, 2) for _ in range(6)])
    small = running([job(holder, 2) for _ in range(2)])
    join = policy().join([big, small], job(holder, 0), now=0.0)
    assert join is not None and join.batch is small
    small.restart = True
    small.joiners.extend(job(holder, 0) for _ in range(5))  # due to restart with 7 jobs
    join = policy().join([big, small], job(holder, 0), now=0.0)
    assert join is not None and join.batch is big  # 6 + 1 against 7 + 1


def test_a_fresh_batch_takes_a_burst_before_its_first_step_but_only_once(holder: Holder) -> None:
    fresh = running([job(holder, 0)], steps=0)
    assert policy().join([fresh], job(holder, 0), now=0.0) is not None
    fresh.jobs[0].restarts = 1  # already restarted once without speaking
    assert policy().join([fresh], job(holder, 0), now=0.0) is None


def test_a_newcomer_waits_for_the_smaller_batch_rather_than_pile_onto_the_larger(
    holder: Holder,
) -> None:
    """The smaller batch was just restarted and has not stepped: it may not take the newcomer
    yet, and the larger one may. The newcomer waits for the smaller one's first step."""
    large = running([job(holder, 2) for _ in range(5)])
    restarted = running([job(holder, 2) for _ in range(2)], steps=0)
    for scheduled in restarted.jobs:
        scheduled.restarts = 1
    assert policy().join([large, restarted], job(holder, 0), now=0.0) is None
    restarted.steps = 1  # it spoke: now it takes the newcomer
    join = policy().join([large, restarted], job(holder, 0), now=0.0)
    assert join is not None and join.batch is restarted
    restarted.steps = 0
    even = running([job(holder, 2) for _ in range(2)])  # no larger than the restarted one
    join = policy().join([even, restarted], job(holder, 0), now=0.0)
    assert join is not None and join.batch is even


def test_overflow_opens_when_every_lane_has_long_to_run(holder: Holder) -> None:
    """Two lanes each 30 steps into a 128-token sequence: ~0.5 s before either ends."""
    lanes = [running([job(holder, 30)], steps=30), running([job(holder, 35)], steps=35)]
    assert policy().overflow(lanes, now=0.0)


def test_overflow_stays_shut_when_a_lane_ends_within_one_pause_budget(holder: Holder) -> None:
    """One batch ends in 4 steps (20 ms < the 40 ms budget): waiting for it costs less."""
    lanes = [running([job(holder, 30)], steps=30), running([job(holder, 124)], steps=124)]
    assert not policy().overflow(lanes, now=0.0)


def test_overflow_waits_for_a_batch_before_its_first_step(holder: Holder) -> None:
    """A batch that has not stepped yet takes joiners in a few ms: no overflow lane for that."""
    lanes = [running([job(holder, 30)], steps=30), running([job(holder, 0)], steps=0)]
    assert not policy().overflow(lanes, now=0.0)


def test_overflow_stays_shut_when_another_lane_would_stretch_steps_past_the_budget(
    holder: Holder,
) -> None:
    """The lanes' measured steps take 100 ms (a saturated device): one lane more would add
    about 100 / 2 = 50 ms to every running step, past the 40 ms pause budget; at 60 ms a step
    it adds 30 ms, within it; with two overflow lanes already busy, 100 / 4 = 25 ms."""
    lanes = [running([job(holder, 30)], steps=30), running([job(holder, 35)], steps=35)]
    for batch in lanes:
        batch.step_seconds = 0.1
    assert not policy().overflow(lanes, now=0.0)
    assert policy().overflow(lanes, now=0.0, spares_busy=2)
    for batch in lanes:
        batch.step_seconds = 0.06
    assert policy().overflow(lanes, now=0.0)


def test_overflow_is_off_with_restarts_off(holder: Holder) -> None:
    rules = RestartRules(16)  # max_stall 0: the scheduler never moves a job
    lanes = [running([job(holder, 30)], steps=30)]
    assert not RestartPolicy(rules, StepTimes(STEPS)).overflow(lanes, now=0.0)


def test_a_restart_takes_its_share_of_the_waiting_jobs_beside_a_batch_before_its_first_step() -> (
    None
):
    # The traced burst: 2 jobs going on, 8 waiting, the other lane's 6 before their first step.
    assert restart_fill(going_on=2, waiting=8, young_loads=[6], room=30) == 6  # 8 and 8
    assert restart_fill(going_on=5, waiting=1, young_loads=[2], room=30) == 0  # already larger
    assert restart_fill(going_on=2, waiting=5, young_loads=[6], room=30) == 5  # 7 beside 6


def test_a_restart_takes_every_waiting_job_that_fits_when_no_batch_is_about_to_take_them() -> None:
    assert restart_fill(going_on=2, waiting=8, young_loads=[], room=30) == 8
    assert restart_fill(going_on=2, waiting=8, young_loads=[], room=5) == 5
    assert restart_fill(going_on=2, waiting=8, young_loads=[6], room=3) == 3


class CountingPolicy(RestartPolicy):
    """The policy as is, counting how often a join is priced."""

    def __init__(self) -> None:
        super().__init__(RULES, StepTimes(STEPS))
        self.priced = 0

    def join(self, running, job, now):  # type: ignore[no-untyped-def]
        self.priced += 1
        return super().join(running, job, now)


def test_alike_waiting_jobs_are_priced_once_per_rebalance(holder: Holder) -> None:
    from worker.engine.fair_share import ReserveShares
    from worker.engine.rebalance import Rebalancer

    # Two long batches deep into their runs: no newcomer joins (its catch-up is too long).
    lanes = [running([job(holder, 100)], steps=100), running([job(holder, 90)], steps=90)]
    waiting = [job(holder, 0) for _ in range(50)]
    counting = CountingPolicy()
    rebalancer = Rebalancer(counting, ReserveShares(0, 32, 16, reserving=False), 2)
    restarts: list[object] = []

    def restart(batch: RunningBatch, **how: object) -> bool:
        restarts.append(how)
        return True

    rebalancer.rebalance(waiting, lanes, 0, restart)
    assert restarts == [] and len(waiting) == 50
    assert counting.priced == 1  # fifty alike jobs, one answer

    # A young batch takes joiners: each join changes the batches, so the next is priced anew.
    young = [running([job(holder, 2)], steps=2), running([job(holder, 3)], steps=3)]
    counting = CountingPolicy()
    rebalancer = Rebalancer(counting, ReserveShares(0, 32, 16, reserving=False), 2)
    fresh = [job(holder, 0) for _ in range(3)]
    rebalancer.rebalance(fresh, young, 0, restart)
    assert len(restarts) == 3 and fresh == []
    assert counting.priced == 3
