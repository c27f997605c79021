"""Dynamic batching on the real engine and a real Redis (no Celery): same results as solo runs,
per-job parameters honoured inside a batch, and newcomers placed by restarts, idle lanes and
overflow lanes (step publishing: test_step_publishing.py)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from tests.scheduler_harness import CPU_LIKE, Harness, solo_outputs
from trickle import keys
from trickle.jobs import FinishReason
from worker.engine.engine import Engine

PROMPTS = [
    "The",
    "Return the number of items",
    "A socket",
    "This module provides access to the mathematical functions",
    "If the value is",
    "Raise",
]


@pytest.fixture
def harness(demo_engine: Engine, private_redis: redis.Redis) -> Iterator[Harness]:
    h = Harness(demo_engine, private_redis, max_batch_size=8, wait_ms=100)
    yield h
    h.close()


@pytest.mark.parametrize("model", ["demo", "tiny-llama"])
def test_batched_greedy_equals_solo_greedy(
    model: str, demo_engine: Engine, llama_engine: Engine, private_redis: redis.Redis
) -> None:
    engine = demo_engine if model == "demo" else llama_engine
    specs: list[dict[str, object]] = [
        {"prompt": prompt, "max_tokens": 10 + 7 * i, "temperature": 0.0, "ignore_eos": True}
        for i, prompt in enumerate(PROMPTS)
    ]
    batched = Harness(engine, private_redis, max_batch_size=8, wait_ms=200)
    try:
        jobs = batched.run([batched.job(**spec) for spec in specs])  # type: ignore[arg-type]
        assert max(batched.scheduler.batch_sizes) == len(specs)  # they really ran together
    finally:
        batched.close()
    assert [job.state.output for job in jobs] == solo_outputs(engine, private_redis, specs)
    assert [job.state.count for job in jobs] == [spec["max_tokens"] for spec in specs]


def test_mixed_parameters_each_get_their_own(harness: Harness, private_redis: redis.Redis) -> None:
    greedy = {"temperature": 0.0, "ignore_eos": True}
    jobs = harness.run(
        [
            harness.job("The", max_tokens=5, **greedy),  # type: ignore[arg-type]
            harness.job("The", max_tokens=40, **greedy),  # type: ignore[arg-type]
            harness.job("A socket", max_tokens=12, temperature=1.2, top_k=20, ignore_eos=True),
            harness.job("Raise", max_tokens=9, temperature=0.7, top_p=0.9, ignore_eos=True),
            harness.job("The", max_tokens=30, seed=5, temperature=1.0, ignore_eos=True),
        ]
    )
    assert [job.state.count for job in jobs] == [5, 40, 12, 9, 30]
    # Greedy jobs share a batch; each sampling configuration and the seeded job run apart.
    assert sorted(harness.scheduler.batch_sizes) == [1, 1, 1, 2]
    long_text = jobs[1].state.output
    assert long_text.startswith(jobs[0].state.output)
    stop = long_text[len(long_text) // 2 : len(long_text) // 2 + 5]
    stopped = harness.run([harness.job("The", max_tokens=40, stop=(stop,), **greedy)])[0]  # type: ignore[arg-type]
    assert stopped.state.finish_reason is FinishReason.STOP
    assert stopped.state.output == long_text[: long_text.index(stop)]


def test_cancel_stops_only_its_own_sequence(harness: Harness, private_redis: redis.Redis) -> None:
    specs = [
        {"prompt": p, "max_tokens": 200, "temperature": 0.0, "ignore_eos": True}
        for p in PROMPTS[:4]
    ]
    jobs = [harness.job(**spec) for spec in specs]  # type: ignore[arg-type]
    victim = jobs[1]

    def cancel_when_started() -> None:
        while victim.state.count < 10:
            time.sleep(0.0005)
        victim.state.request_stop(FinishReason.CANCELED)

    canceller = threading.Thread(target=cancel_when_started)
    canceller.start()
    harness.run(jobs)
    canceller.join()
    assert victim.state.finish_reason is FinishReason.CANCELED
    assert 10 <= victim.state.count < 200
    others = [job for job in jobs if job is not victim]
    assert all(job.state.count == 200 for job in others)
    expected = solo_outputs(harness.engine, private_redis, [specs[0], specs[2], specs[3]])
    assert [job.state.output for job in others] == expected


@pytest.mark.parametrize("model", ["demo", "tiny-llama"])
def test_a_newcomer_restarts_a_young_batch_and_nothing_changes_for_the_runner(
    model: str, demo_engine: Engine, llama_engine: Engine, private_redis: redis.Redis
) -> None:
    """One lane, busy: a newcomer joins by restarting the batch. The running job continues from
    prompt + generated text, so its greedy output, count and replay log are as if alone."""
    engine = demo_engine if model == "demo" else llama_engine
    specs: list[dict[str, object]] = [
        # Long enough to be still running when the newcomer comes, however the cores are shared
        # (at about a millisecond a token, 300 tokens could end before the test thread woke).
        {"prompt": PROMPTS[1], "max_tokens": 1000, "temperature": 0.0, "ignore_eos": True},
        {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0.0, "ignore_eos": True},
    ]
    harness = Harness(engine, private_redis, 8, wait_ms=0, rebatch_max_stall_ms=60_000)
    try:
        runner, newcomer = (harness.job(**spec) for spec in specs)  # type: ignore[arg-type]
        harness.runner_then_newcomer(runner, newcomer, after_tokens=5, timeout=60)
        assert harness.scheduler.restarts >= 1
        assert runner.restarts >= 1
        assert newcomer.batch_started_at is not None and runner.last_token_at is not None
        assert newcomer.batch_started_at < runner.last_token_at  # it did not wait for the runner
    finally:
        harness.close()
    assert [runner.state.output, newcomer.state.output] == solo_outputs(
        engine, private_redis, specs
    )
    assert [runner.state.count, newcomer.state.count] == [1000, 20]
    for job in (runner, newcomer):
        key = keys.job_tokens(job.job_id)
        deadline = time.monotonic() + 10
        while private_redis.llen(key) < job.state.count:  # the publisher's last flush
            assert time.monotonic() < deadline, "tokens never all stored"
            time.sleep(0.01)
        entries = private_redis.lrange(key, 0, -1)
        indexes = [json.loads(entry)["index"] for entry in entries]
        assert indexes == list(range(job.state.count))  # every token once, in order
        assert "".join(json.loads(entry)["text"] for entry in entries) == job.state.output


def test_two_idle_lanes_waiting_out_windows_share_the_jobs_and_both_survive(
    demo_engine: Engine, private_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Both lanes idle: the first job wakes one into its admission window, the second wakes the
    other into its own. The first window to end takes its share (one job: two lanes are free),
    the other lane the rest, and both lanes survive (a lane that found no job left once raised
    IndexError and its thread died, leaving one lane for good)."""
    harness = Harness(demo_engine, private_redis, 8, wait_ms=150, engine_threads=2)
    try:
        spec: dict[str, object] = {"prompt": "The", "max_tokens": 3, "temperature": 0.0}
        first, second = harness.job(**spec), harness.job(**spec)  # type: ignore[arg-type]
        harness.scheduler.submit(first)
        time.sleep(0.03)
        harness.scheduler.submit(second)
        assert first.ended.wait(30) and second.ended.wait(30)
        time.sleep(0.3)  # past the second lane's window
        assert list(harness.scheduler.batch_sizes) == [1, 1]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        # Both lanes still serve: two jobs of different sampling run at once, one per lane.
        third = harness.job(prompt="A", max_tokens=3, temperature=0.0)
        fourth = harness.job(prompt="A", max_tokens=3, temperature=0.5)
        harness.run([third, fourth])
        assert list(harness.scheduler.batch_sizes)[2:] == [1, 1]
        assert all(thread.is_alive() for thread in harness.scheduler._threads)
    finally:
        harness.close()


@pytest.mark.parametrize("stall_ms", [60_000.0, 0.001])
def test_a_newcomer_takes_the_idle_lane_instead_of_pausing_a_batch(
    stall_ms: float, demo_engine: Engine, private_redis: redis.Redis
) -> None:
    """Two lanes, one idle: a newcomer starts there at once, however cheap a restart of the
    running batch would be (it once joined that batch to keep the lane free for the rest of a
    burst, and a burst then piled onto one core; an idle lane now takes half of a busy batch
    instead). Outputs are the solo ones."""
    assert demo_engine.settings.inter_threads >= 2
    assert demo_engine.warm_step_seconds  # the warm-up timed a decoding step
    specs: list[dict[str, object]] = [
        {"prompt": PROMPTS[1], "max_tokens": 400, "temperature": 0.0, "ignore_eos": True},
        {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0.0, "ignore_eos": True},
    ]
    harness = Harness(
        demo_engine, private_redis, 8, wait_ms=0, rebatch_max_stall_ms=stall_ms, engine_threads=2
    )
    try:
        runner, newcomer = (harness.job(**spec) for spec in specs)  # type: ignore[arg-type]
        harness.runner_then_newcomer(runner, newcomer, after_tokens=3, timeout=60)
        assert runner.restarts == 0 and list(harness.scheduler.batch_sizes) == [1, 1]
    finally:
        harness.close()
    outputs = solo_outputs(demo_engine, private_redis, specs)
    assert [runner.state.output, newcomer.state.output] == outputs


def test_a_batch_with_a_repetition_penalty_is_never_restarted(
    demo_engine: Engine, private_redis: redis.Redis
) -> None:
    """CTranslate2 penalizes generated tokens, not the prompt: a restart would feed the runner's
    tokens back as prompt and change its greedy output. The newcomer waits instead."""
    specs: list[dict[str, object]] = [
        {"prompt": "The value", "max_tokens": 200, "temperature": 0.0, "repetition_penalty": 1.5},
        {"prompt": "The", "max_tokens": 10, "temperature": 0.0, "repetition_penalty": 1.5},
    ]
    for spec in specs:
        spec["ignore_eos"] = True
    harness = Harness(demo_engine, private_redis, 8, wait_ms=0, rebatch_max_stall_ms=60_000)
    try:
        runner, newcomer = (harness.job(**spec) for spec in specs)  # type: ignore[arg-type]
        harness.runner_then_newcomer(runner, newcomer, after_tokens=20, timeout=60)
        assert runner.restarts == 0 and harness.scheduler.restarts == 0
    finally:
        harness.close()
    outputs = solo_outputs(demo_engine, private_redis, specs)
    assert [runner.state.output, newcomer.state.output] == outputs


def test_a_newcomer_joins_a_long_batch_when_its_wait_dwarfs_the_pause(
    demo_engine: Engine, private_redis: redis.Redis
) -> None:
    """One lane, well past the short-pause budget: with ``rebatch_wait_ratio`` the newcomer
    still joins (its wait for the lane would be many times the runner's catch-up pause); with
    the ratio off it waits for the whole generation. The runner's output is unchanged."""
    specs: list[dict[str, object]] = [
        {"prompt": PROMPTS[1], "max_tokens": 1500, "temperature": 0.0, "ignore_eos": True},
        {"prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0.0, "ignore_eos": True},
    ]
    outputs = {}
    for ratio, joins in ((4.0, True), (0.0, False)):
        harness = Harness(
            demo_engine, private_redis, 8, wait_ms=0, rebatch_max_stall_ms=0.001,
            rebatch_wait_ratio=ratio,
        )  # fmt: skip
        try:
            runner, newcomer = (harness.job(**spec) for spec in specs)  # type: ignore[arg-type]
            # 40 tokens in: far past a 1 µs pause budget.
            harness.runner_then_newcomer(runner, newcomer, after_tokens=40, timeout=120)
            assert newcomer.first_token_at is not None and runner.last_token_at is not None
            assert (newcomer.first_token_at < runner.last_token_at) is joins
            assert (runner.restarts >= 1) is joins
            assert runner.long_pauses == (1 if joins else 0)  # once per job at most
            outputs[ratio] = [runner.state.output, newcomer.state.output]
        finally:
            harness.close()
    assert outputs[4.0] == outputs[0.0]  # a restart changes nothing in greedy output


@pytest.mark.parametrize("spare_lanes", [1, 0])
def test_a_newcomer_no_batch_takes_cheaply_starts_on_an_overflow_lane(
    spare_lanes: int, demo_engine: Engine, private_redis: redis.Redis
) -> None:
    """The only lane runs a long sequence 40 tokens in: joining it would pause that stream 40
    steps (past the 40 ms budget). With an overflow lane the newcomer starts there at once and
    ends long before the runner, which is never restarted; without one it waits for the
    runner's end. Outputs are the solo ones either way."""
    assert demo_engine.lanes.spare >= 1  # the engine's overflow lanes
    specs: list[dict[str, object]] = [
        {"prompt": PROMPTS[1], "max_tokens": 1200, "temperature": 0.0, "ignore_eos": True},
        {"prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0.0, "ignore_eos": True},
    ]
    harness = Harness(
        demo_engine, private_redis, 8, wait_ms=0, rebatch_max_stall_ms=40, engine_threads=1,
        pricing=CPU_LIKE, spare_lanes=spare_lanes,
    )  # fmt: skip
    try:
        runner, newcomer = (harness.job(**spec) for spec in specs)  # type: ignore[arg-type]
        harness.runner_then_newcomer(runner, newcomer, after_tokens=40, timeout=120)
        assert newcomer.first_token_at is not None and runner.last_token_at is not None
        if spare_lanes:
            assert newcomer.last_token_at is not None
            assert newcomer.last_token_at < runner.last_token_at
        else:
            assert newcomer.first_token_at > runner.last_token_at
        assert runner.restarts == 0 and harness.scheduler.restarts == 0
    finally:
        harness.close()
    outputs = solo_outputs(demo_engine, private_redis, specs)
    assert [runner.state.output, newcomer.state.output] == outputs


def test_a_lone_job_after_a_quiet_spell_does_not_wait_the_batch_window(
    demo_engine: Engine, private_redis: redis.Redis
) -> None:
    # A 300 ms window would delay every lone job by 300 ms; after a quiet spell (20 ms without
    # an arrival) a job starts at once. With the rule off, the same job waits the window.
    spec = {"prompt": "The", "max_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    for quiet_ms, waits in ((20.0, False), (0.0, True)):
        h = Harness(demo_engine, private_redis, 8, wait_ms=300, quiet_start_after_ms=quiet_ms)
        try:
            lone = h.job(**spec)  # type: ignore[arg-type]
            submitted = time.time()
            h.run([lone])
            assert lone.batch_started_at is not None
            assert (lone.batch_started_at - submitted > 0.25) is waits
        finally:
            h.close()
