"""When a lane takes its next newcomer, by the join rule, and how the outlook prices its rows:
a running call's unused rows are not free now (CTranslate2 adds no row to a running call)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trickle.params import GenerationParams
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer
from trickle.waiting import QueuedEntry, start_times
from worker.engine.batch import PACE_STEPS, RunningBatch
from worker.engine.lane_views import LaneOpening, lane_openings, opens_in
from worker.engine.new_job import make_scheduled_job
from worker.engine.policy import RestartPolicy, RestartRules
from worker.engine.scheduled import ScheduledJob
from worker.engine.step_times import StepTimes
from worker.outlook import lane_rows, model_outlook

# The policy tests' CPU-like model: a step grows with the batch (1: 2 ms, 16: 12 ms).
POLICY = RestartPolicy(
    RestartRules(16, max_stall=0.04, wait_ratio=4.0, prefill_seconds_per_token=0.0001),
    StepTimes({1: 0.002, 16: 0.012}),
)
STEP = 0.005  # each batch's own recent step


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> SentencePieceTokenizer:
    return SentencePieceTokenizer(str(demo_model_dir / "tokenizer.model"), add_bos=True)


def job(tokenizer: SentencePieceTokenizer, generated: int, max_tokens: int, **params: Any) -> Any:
    holder = SimpleNamespace(tokenizer=tokenizer, stop_ids=lambda options: frozenset())
    options = GenerationParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, **params)
    scheduled = make_scheduled_job(holder, "j", tokenizer.encode("The"), options, "f")  # type: ignore[arg-type]
    scheduled.generated_ids = [5] * generated
    return scheduled


def batch(jobs: list[ScheduledJob], steps: int) -> RunningBatch:
    running = RunningBatch(jobs, [j.current_request() for j in jobs], steps=steps)
    running.step_seconds = STEP
    return running


def test_a_lane_before_its_first_step_or_due_to_restart_takes_a_newcomer_now(
    tokenizer: SentencePieceTokenizer,
) -> None:
    fresh = batch([job(tokenizer, 0, 128)], steps=0)
    assert opens_in(POLICY, fresh, [fresh], now=0.0) == 0.0
    due = batch([job(tokenizer, 100, 128)], steps=100)
    due.restart = True  # a joiner is on its way: more come at no further cost
    assert opens_in(POLICY, due, [due], now=0.0) == 0.0


def test_a_young_call_takes_a_newcomer_now_by_a_short_pause(
    tokenizer: SentencePieceTokenizer,
) -> None:
    young = batch([job(tokenizer, 2, 128)], steps=2)  # a 2-step catch-up: a few ms
    assert opens_in(POLICY, young, [young], now=0.0) == 0.0


def test_a_call_deep_into_its_run_opens_only_at_its_end(tokenizer: SentencePieceTokenizer) -> None:
    # 100 steps to catch up (~0.27 s at two rows) against a 28-step (0.14 s) wait: no join.
    deep = batch([job(tokenizer, 100, 128)], steps=100)
    assert opens_in(POLICY, deep, [deep], now=0.0) == pytest.approx(28 * STEP)


def test_a_call_opens_when_another_lane_ends_and_a_long_pause_then_pays(
    tokenizer: SentencePieceTokenizer,
) -> None:
    """Now the nearest lane ends in 60 ms, so a 20-step catch-up (~54 ms) does not pay; once
    it ended, the wait for a lane is this call's 2.4 s and a 32-step catch-up pays four times
    over: the rule takes the newcomer then, not at this call's end."""
    early = batch([job(tokenizer, 20, 512)], steps=20)
    ending = batch([job(tokenizer, 500, 512)], steps=500)
    assert opens_in(POLICY, early, [early, ending], now=0.0) == pytest.approx(12 * STEP)
    early.jobs[0].long_pauses = 1  # it had its one long pause: only its end
    assert opens_in(POLICY, early, [early, ending], now=0.0) == pytest.approx(492 * STEP)


def test_a_call_that_cannot_restart_opens_at_its_end(tokenizer: SentencePieceTokenizer) -> None:
    penalised = batch([job(tokenizer, 2, 128, repetition_penalty=1.3)], steps=2)
    assert opens_in(POLICY, penalised, [penalised], now=0.0) == pytest.approx(126 * STEP)


def test_every_lane_is_listed_idle_ones_open_now(tokenizer: SentencePieceTokenizer) -> None:
    deep = batch([job(tokenizer, 100, 128)], steps=100)
    lanes = lane_openings(POLICY, [deep], idle_lanes=2, now=0.0)
    assert [len(lane.jobs) for lane in lanes] == [1, 0, 0]
    assert [lane.opens_in for lane in lanes] == pytest.approx([28 * STEP, 0.0, 0.0])


def test_a_lanes_rows_free_when_it_opens_and_not_before_their_jobs_end() -> None:
    one, two, three = object(), object(), object()
    ends = {id(one): 0.5, id(two): 3.0, id(three): 2.0}
    mid_call = LaneOpening((one, two), 1.0)  # type: ignore[arg-type]
    # Its rule's bound (5 s, by max_tokens) is past its jobs' expected end (2 s): then.
    bounded = LaneOpening((three,), 5.0)  # type: ignore[arg-type]
    idle = LaneOpening((), 0.0)
    assert lane_rows([mid_call], ends, 4) == ([1.0, 3.0], [1.0, 1.0])
    assert lane_rows([bounded, idle], ends, 2) == ([2.0], [2.0, 0.0, 0.0])


def running_job(made: int, budget: int) -> Any:
    """A job in a batch at 0.1 s a token (the outlook reads its times and counts)."""
    return SimpleNamespace(
        job_id="job_r",
        generated_ids=[1] * made,
        request=SimpleNamespace(max_new_tokens=budget),
        first_token_at=0.0,
        last_token_at=(made - 1) * 0.1,
        batch_started_at=0.0,
    )


def test_a_mid_call_lanes_unused_rows_price_a_queued_job_at_its_opening() -> None:
    """One lane of 4 rows runs one job (30 tokens left: 3 s) and opens to a newcomer in 1 s:
    a claimed job and the queued jobs start then, not now; an idle lane's rows are free."""
    running = running_job(11, 41)
    lane = LaneOpening((running,), 1.0)
    waiting = SimpleNamespace(
        job_id="job_w",
        generated_ids=[],
        request=SimpleNamespace(max_new_tokens=10),
        batch_started_at=None,
    )
    outlook = model_outlook([running, waiting], 4, 1.0, lambda size: None, 50.0, None, [lane], 4)
    assert outlook.claimed_waiting == (("job_w", pytest.approx(1.0)),)
    assert outlook.free_in == pytest.approx((1.0, 1.0, 2.0, 3.0))
    queued = [QueuedEntry("q", 1.0, 0, "", 10)]
    assert start_times(queued, [outlook], now=50.0) == pytest.approx([1.0])
    idle = model_outlook([], 4, 1.0, lambda size: None, 50.0, None, [LaneOpening((), 0.0)], 4)
    assert idle.free_in == (0.0, 0.0, 0.0, 0.0)


def test_a_row_in_a_call_goes_at_the_calls_step_now() -> None:
    """It went 0.1 s a token alone; its call now steps every 0.2 s (the lanes filled): its
    30 tokens left take 6 s, and the lane's unused row opens then too (the rule's own bound,
    by max_tokens, is later)."""
    lane = LaneOpening((running := running_job(11, 41),), 10.0, step_seconds=0.2)
    outlook = model_outlook([running], 2, 1.0, lambda size: None, 50.0, None, [lane], 2)
    assert outlook.free_in == pytest.approx((6.0, 6.0))
    # A newcomer's pace: the calls' step now, not the job's own life's (it went alone then).
    assert outlook.seconds_per_token == pytest.approx(0.2)


def test_a_worker_holding_its_window_frees_a_slot_only_as_a_job_ends() -> None:
    """One slot (its prefetch window) held by a job with 3 s to go, beside an idle lane: a
    queued job starts when that job ends, not on the idle lane (the worker takes no more)."""
    running = running_job(11, 41)
    lanes = [LaneOpening((running,), 3.0, 0.1), LaneOpening((), 0.0)]
    outlook = model_outlook([running], 1, 1.0, lambda size: None, 50.0, None, lanes, 1)
    assert outlook.free_in == pytest.approx((3.0,))
    wider = model_outlook([running], 2, 1.0, lambda size: None, 50.0, None, lanes, 1)
    assert wider.free_in == pytest.approx((0.0, 3.0))


def test_a_calls_steady_step_outlasts_its_swings(tokenizer: SentencePieceTokenizer) -> None:
    """Lanes sharing two cores step unevenly: the recent step follows the last few, the steady
    one whole stretches of ``PACE_STEPS``, and the outlook prices rows at the steady one."""
    running = batch([job(tokenizer, 0, 512)], steps=0)
    times = StepTimes()
    now = 0.0
    running.stepped(now, times)
    for step in range(PACE_STEPS * 2):
        now += 0.030 if step < PACE_STEPS else 0.010  # a slow stretch (the admission), then not
        running.stepped(now, times)
    assert running.steady_step_seconds == pytest.approx(0.020)  # each stretch weighs half
    for _ in range(3):
        now += 0.050  # three slow steps: the recent step swings, the steady one does not yet
        running.stepped(now, times)
    assert running.step_seconds is not None and running.step_seconds > 0.030
    assert running.steady_step_seconds == pytest.approx(0.020)
    (opening,) = lane_openings(POLICY, [running], 0, now)
    assert opening.step_seconds == pytest.approx(0.020)
