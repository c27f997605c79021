"""No lane idles beside work it could share: bursts spread over the lanes, and a lane that frees
takes half of a busy batch. Real engine, real publisher, real Redis; outputs against solo runs
(float32 models: a restart changes no greedy output there, see tests/system/test_prefix.py)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import redis

from tests.scheduler_harness import CPU_LIKE, Harness, solo_outputs
from trickle import keys
from trickle.config.sections import ModelSettings
from trickle.jobs import FinishReason
from worker.engine.engine import Engine

PROMPTS = ["The", "Return the number of items", "A socket", "If the value is", "Raise", "This"]


def greedy(prompt: str, max_tokens: int, **extra: object) -> dict[str, object]:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            **extra}  # fmt: skip


def assert_logged_in_order(client: redis.Redis, job_id: str, count: int, output: str) -> None:
    key = keys.job_tokens(job_id)
    deadline = time.monotonic() + 10
    while client.llen(key) < count:  # the publisher's last flush
        assert time.monotonic() < deadline, "tokens never all stored"
        time.sleep(0.01)
    entries = [json.loads(entry) for entry in client.lrange(key, 0, -1)]
    assert [entry["index"] for entry in entries] == list(range(count))
    assert "".join(entry["text"] for entry in entries) == output


def test_a_simultaneous_burst_is_shared_by_the_free_lanes(
    demo_engine: Engine, private_redis: redis.Redis
) -> None:
    harness = Harness(demo_engine, private_redis, 32, wait_ms=20, engine_threads=2)
    try:
        harness.run([harness.job(**greedy("The", 40)) for _ in range(8)])  # type: ignore[arg-type]
    finally:
        harness.close()
    assert sorted(harness.scheduler.batch_sizes) == [4, 4]


@pytest.mark.parametrize("model", ["demo", "tiny-llama"])
def test_a_lane_that_frees_takes_half_of_the_busy_batch_and_no_output_changes(
    model: str, demo_engine: Engine, llama_engine: Engine, private_redis: redis.Redis
) -> None:
    """Lane A runs a job no other can join (a repetition penalty), so the burst that follows
    lands on lane B whole. A frees (the job is canceled) once B's batch has 60 tokens, most of
    its steps ahead: B's batch is split, both lanes run to the end, and every output, count and
    replay log is the solo one. (Canceled rather than timed by its length: two lanes' step
    rates differ with how the cores are shared, more so on the tiny model, where a 150-token
    blocker once outlasted 500 of the batch's steps.)"""
    engine = demo_engine if model == "demo" else llama_engine
    blocker = greedy("The value", 2_000, repetition_penalty=1.5)
    specs = [greedy(prompt, 500 + 10 * i) for i, prompt in enumerate(PROMPTS[:4])]
    harness = Harness(
        engine, private_redis, 8, wait_ms=5, rebatch_max_stall_ms=40, engine_threads=2,
        rebalance_gain_ratio=1.0, pricing=CPU_LIKE,
    )  # fmt: skip
    try:
        short = harness.job(**blocker)  # type: ignore[arg-type]
        jobs = [harness.job(**spec) for spec in specs]  # type: ignore[arg-type]
        harness.scheduler.submit(short)
        while short.state.count < 2:
            time.sleep(0.0005)
        for job in jobs:
            harness.scheduler.submit(job)
        deadline = time.monotonic() + 30
        while jobs[0].state.count < 60:
            assert time.monotonic() < deadline and not short.ended.is_set()
            time.sleep(0.0005)
        short.state.request_stop(FinishReason.CANCELED)
        assert short.ended.wait(30)
        assert all(job.ended.wait(60) for job in jobs)
        assert harness.scheduler.splits >= 1
        assert all(job.restarts >= 1 for job in jobs)
    finally:
        harness.close()
    sizes = list(harness.scheduler.batch_sizes)
    assert sizes[:2] == [1, 4] and sorted(sizes[2:4]) == [2, 2], sizes
    assert [job.state.output for job in jobs] == solo_outputs(engine, private_redis, specs)
    assert [job.state.count for job in jobs] == [spec["max_tokens"] for spec in specs]
    for job in jobs:
        assert_logged_in_order(private_redis, job.job_id, job.state.count, job.state.output)


def test_a_split_is_not_made_when_the_catch_up_outweighs_what_it_saves(
    demo_engine: Engine, private_redis: redis.Redis
) -> None:
    """The same shape, but the busy batch is nearly done when the lane frees: no split."""
    blocker = greedy("The value", 12, repetition_penalty=1.5)
    harness = Harness(
        demo_engine, private_redis, 8, wait_ms=5, rebatch_max_stall_ms=40, engine_threads=2,
        rebalance_gain_ratio=1_000.0, pricing=CPU_LIKE,
    )  # fmt: skip
    try:
        short = harness.job(**blocker)  # type: ignore[arg-type]
        harness.scheduler.submit(short)
        jobs = harness.run([harness.job(**greedy(p, 200)) for p in PROMPTS[:4]])  # type: ignore[arg-type]
        assert short.ended.wait(30)
    finally:
        harness.close()
    assert harness.scheduler.splits == 0 and all(job.restarts == 0 for job in jobs)


def test_a_burst_arriving_one_job_at_a_time_spreads_over_both_lanes(
    demo_engine: Engine, private_redis: redis.Redis
) -> None:
    """Jobs a millisecond apart: the first starts alone, the rest join whichever batch is
    smaller, so neither lane ends up with most of the burst. The pause budget is wide enough
    for the whole arrival (on a loaded machine a millisecond's sleep can stretch to several and
    a lane's streams then outgrow a 40 ms pause), so the smaller-batch rule is what decides."""
    harness = Harness(
        demo_engine, private_redis, 32, wait_ms=1, rebatch_max_stall_ms=150,
        quiet_start_after_ms=20, rebatch_wait_ratio=4.0, engine_threads=2, pricing=CPU_LIKE,
    )  # fmt: skip
    specs = [greedy(PROMPTS[i % len(PROMPTS)], 400) for i in range(12)]
    try:
        jobs = [harness.job(**spec) for spec in specs]  # type: ignore[arg-type]
        for job in jobs:
            harness.scheduler.submit(job)
            time.sleep(0.001)
        peak = 0
        while not all(job.ended.is_set() for job in jobs):
            with harness.scheduler._cond:
                loads = [batch.load() for batch in harness.scheduler._running]
            if len(loads) == 2 and sum(loads) == len(jobs):
                peak = max(peak, max(loads))
            time.sleep(0.002)
    finally:
        harness.close()
    sizes = list(harness.scheduler.batch_sizes)
    assert 0 < peak <= 7, f"one lane held {peak} of {len(jobs)} jobs (batches {sizes})"
    assert [job.state.output for job in jobs] == solo_outputs(demo_engine, private_redis, specs)


def test_lanes_count_every_replica_ctranslate2_builds() -> None:
    """CTranslate2 makes inter_threads replicas per device index (one copy of the weights per
    device, shared by its replicas): the scheduler runs a lane thread for each."""
    one_gpu = ModelSettings(name="m", path="", device="cuda", inter_threads=2)
    assert one_gpu.lanes == 2
    assert dataclasses.replace(one_gpu, device_index=(0, 1)).lanes == 4
    assert ModelSettings(name="m", path="").with_threads(2).lanes == 2  # CPU: min(2, cores)
