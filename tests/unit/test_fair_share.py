"""Which waiting jobs the reserve lane may take (pure logic over the scheduler's state; the demo
model's tokenizer for the jobs' sequence state): only those of keys below an equal share of the
ordinary lanes' slots, and none while a single key has work. A job that runs alone (seeded, or
constrained with min_tokens or a repetition penalty) holds a whole lane's slots; a constrained
job that batches, or one reporting alternatives, holds its row."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_policy import Holder
from trickle.jobs import FinishReason
from trickle.params import GenerationParams
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer
from worker.engine.batch import RunningBatch
from worker.engine.fair_share import ReserveShares, keys_below_share, reserve_candidates
from worker.engine.new_job import make_scheduled_job
from worker.engine.scheduled import ScheduledJob


@pytest.fixture(scope="module")
def holder(demo_model_dir: Path) -> Holder:
    tokenizer = SentencePieceTokenizer(str(demo_model_dir / "tokenizer.model"), add_bos=True)
    return Holder(tokenizer, tokenizer.eos_id)


def jobs(
    holder: Holder, tenant: str, count: int, priority: int = 0, **options: object
) -> list[ScheduledJob]:
    params = GenerationParams(max_tokens=16, ignore_eos=True, **{"temperature": 0.0, **options})  # type: ignore[arg-type]
    prompt = holder.tokenizer.encode("The")
    return [
        make_scheduled_job(holder, f"{tenant}{n}", prompt, params, "f", priority=priority,  # type: ignore[arg-type]
                           tenant=tenant)
        for n in range(count)
    ]  # fmt: skip


def batch(members: list[ScheduledJob], spare: bool = False) -> RunningBatch:
    return RunningBatch(members, [job.current_request() for job in members], spare=spare)


def test_a_key_alone_never_gets_the_reserve(holder: Holder) -> None:
    lanes = [batch(jobs(holder, "a", 4)), batch(jobs(holder, "a", 4))]
    waiting = jobs(holder, "a", 3)
    assert keys_below_share(waiting, lanes, lane_slots=8, batch_size=4) == set()
    assert reserve_candidates(waiting, lanes, lane_slots=8, batch_size=4) == []


def test_another_keys_job_beside_a_flood_may_take_it(holder: Holder) -> None:
    lanes = [batch(jobs(holder, "a", 4)), batch(jobs(holder, "a", 4))]
    waiting = [*jobs(holder, "a", 2), *jobs(holder, "b", 1)]
    assert keys_below_share(waiting, lanes, lane_slots=8, batch_size=4) == {"b"}
    assert [job.job_id for job in reserve_candidates(waiting, lanes, 8, batch_size=4)] == ["b0"]


def test_a_key_at_its_share_of_the_lanes_does_not(holder: Holder) -> None:
    # b holds 4 of 8 lane slots (its equal share with a): neither key is below its share.
    lanes = [batch(jobs(holder, "a", 4)), batch(jobs(holder, "b", 4))]
    waiting = [*jobs(holder, "a", 1), *jobs(holder, "b", 1)]
    assert keys_below_share(waiting, lanes, lane_slots=8, batch_size=4) == set()


def test_the_reserve_lanes_own_jobs_do_not_count_against_the_share(holder: Holder) -> None:
    # b's first job runs on the reserve lane; its next one may join it there.
    lanes = [batch(jobs(holder, "a", 4)), batch(jobs(holder, "a", 4))]
    spare = batch(jobs(holder, "b", 1), spare=True)
    waiting = jobs(holder, "b", 1)
    assert keys_below_share(waiting, [*lanes, spare], lane_slots=8, batch_size=4) == {"b"}


def test_interactive_work_comes_first_then_arrival_order(holder: Holder) -> None:
    lanes = [batch(jobs(holder, "a", 8))]
    late_batch, early = jobs(holder, "b", 1, priority=9), jobs(holder, "c", 2)
    waiting = [*late_batch, *early]
    picked = reserve_candidates(waiting, lanes, lane_slots=8, batch_size=8)
    assert [job.job_id for job in picked] == ["c0", "c1", "b0"]


def test_a_finished_sequence_frees_its_share(holder: Holder) -> None:
    flood = jobs(holder, "a", 4)
    lanes = [batch(flood)]
    waiting = jobs(holder, "b", 1)
    assert keys_below_share(waiting, lanes, lane_slots=4, batch_size=4) == {"b"}
    for job in flood[:3]:
        job.state.finish_without_token(FinishReason.LENGTH)
    # a now holds 1 of 4 slots, below its share of 2 as well.
    assert keys_below_share(waiting, lanes, lane_slots=4, batch_size=4) == {"a", "b"}


def test_a_restarting_lanes_jobs_still_count_as_held(holder: Holder) -> None:
    """Between a restarted batch's end and its next batch its jobs are on neither list: they
    must not look like free slots, or the reserve lane would take the flood's waiting jobs."""
    shares = ReserveShares(lanes=1, lane_slots=8, batch_size=8)
    restarting = jobs(holder, "a", 8)
    waiting = [*jobs(holder, "a", 1), *jobs(holder, "b", 1)]
    assert shares.below(waiting, []) == {"a", "b"}  # as if a held nothing
    in_hand = shares.hand_over(restarting, spare=False)
    assert in_hand is restarting
    assert shares.below(waiting, []) == {"b"}
    assert [job.job_id for job in shares.candidates(waiting, [])] == ["b0"]
    shares.taken(restarting)
    assert shares.below(waiting, []) == {"a", "b"}


def test_without_a_reserve_lane_nothing_is_below_share(holder: Holder) -> None:
    shares = ReserveShares(lanes=0, lane_slots=8, batch_size=8)
    lanes = [batch(jobs(holder, "a", 8))]
    waiting = jobs(holder, "b", 1)
    assert shares.below(waiting, lanes) == set() and shares.candidates(waiting, lanes) == []


# What makes a job run alone: a seed (when sampling), a grammar with min_tokens or a penalty.
GRAMMAR = '{"grammars": [{"lark_grammar": "start: /[a-z]+/"}]}'
ALONE = [
    pytest.param({"grammar": GRAMMAR, "repetition_penalty": 1.2}, id="constrained-penalty"),
    pytest.param({"seed": 7, "temperature": 0.8}, id="seeded"),
]
# Jobs that read their logits and still batch (worker/engine/shared_rows.py): a row each.
SHARED = [
    pytest.param({"grammar": GRAMMAR}, id="constrained"),
    pytest.param({"top_logprobs": 20}, id="alternatives"),
]


@pytest.mark.parametrize("options", ALONE)
def test_jobs_that_run_alone_hold_whole_lanes(holder: Holder, options: dict[str, object]) -> None:
    """The audit's probe: key a's jobs that run alone fill both ordinary lanes (one row each).
    Counted as rows, a held 2 of 8 slots, below its share of 4, and the reserve lane took its
    third job too; counted as lanes it holds all 8, and only b's job is the reserve's."""
    lanes = [batch(jobs(holder, "a", 1, **options)), batch(jobs(holder, "a", 1, **options))]
    waiting = [*jobs(holder, "a", 1, **options), *jobs(holder, "b", 1)]
    assert keys_below_share(waiting, lanes, lane_slots=8, batch_size=4) == {"b"}
    assert [job.job_id for job in reserve_candidates(waiting, lanes, 8, batch_size=4)] == ["b0"]


@pytest.mark.parametrize("options", SHARED)
def test_jobs_that_read_their_logits_and_batch_hold_a_row_each(
    holder: Holder, options: dict[str, object]
) -> None:
    """Key a's constrained jobs share a lane's batch: two of them hold 2 of 8 slots, below
    a's share of 4, so the reserve lane may take a's next one as well as b's."""
    lanes = [batch(jobs(holder, "a", 2, **options)), batch(jobs(holder, "b", 4))]
    waiting = [*jobs(holder, "a", 1, **options), *jobs(holder, "b", 1)]
    assert keys_below_share(waiting, lanes, lane_slots=8, batch_size=4) == {"a"}


def test_one_lane_of_jobs_that_run_alone_is_a_keys_share_of_two(holder: Holder) -> None:
    """a runs one job alone (a whole lane), b a batch of two on the other: a holds its equal
    share (4 of 8) and may not take the reserve; b holds 2 and may."""
    seeded = {"seed": 5, "temperature": 0.8}
    lanes = [batch(jobs(holder, "a", 1, **seeded)), batch(jobs(holder, "b", 2))]
    waiting = [*jobs(holder, "a", 1, **seeded), *jobs(holder, "b", 1)]
    assert keys_below_share(waiting, lanes, lane_slots=8, batch_size=4) == {"b"}


def test_a_job_alone_on_the_reserve_lane_holds_no_share(holder: Holder) -> None:
    """b's job that runs alone took the reserve lane beside a's flood: b is still below its
    share of the ordinary lanes (it waits for the reserve lane, not the flood's batches)."""
    flood = [batch(jobs(holder, "a", 4)), batch(jobs(holder, "a", 4))]
    spare = batch(jobs(holder, "b", 1, seed=3, temperature=0.7), spare=True)
    waiting = jobs(holder, "b", 1)
    assert keys_below_share(waiting, [*flood, spare], lane_slots=8, batch_size=4) == {"b"}


def test_a_restarting_lane_of_a_job_alone_still_holds_the_lane(holder: Holder) -> None:
    shares = ReserveShares(lanes=1, lane_slots=4, batch_size=4)
    restarting = jobs(holder, "a", 1, seed=3, temperature=0.8)
    waiting = [*jobs(holder, "a", 1, seed=3, temperature=0.8), *jobs(holder, "b", 1)]
    shares.hand_over(restarting, spare=False)
    assert shares.below(waiting, []) == {"b"}
