"""Fencing and exactly-once at the store level: the Redis contract any publisher must rely on.

These tests drive ``JobStore`` (its Lua scripts) on a private Redis, the way a worker does: claim
under a lease, append token steps, finish. They pin what Redis accepts, not how the publisher or
scheduler call it, so they keep holding through a rewrite of either.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
import redis

from tests.faultstack import wait_for
from trickle import keys
from trickle.events import TokenEvent
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, Job, JobStatus, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import JobStore, StepAppend, StepOutcome, finish_outcome
from trickle.store.leases import Claim


@pytest.fixture
def store(private_redis: redis.Redis) -> JobStore:
    return JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)


def new_job(store: JobStore) -> Job:
    job = Job(new_job_id(), "demo", "hi", GenerationParams(), created_at=time.time())
    store.create(job)
    return job


def events(job_id: str, first: int, count: int) -> list[TokenEvent]:
    return [TokenEvent(job_id, i, f"<{i}>") for i in range(first, first + count)]


def append(store: JobStore, appends: Sequence[StepAppend]) -> StepOutcome:
    pipe = store.redis.pipeline(transaction=False)
    store.queue_step(pipe, appends)
    (reply,) = pipe.execute()
    return store.step_outcome(appends, reply)


def log(store: JobStore, job_id: str) -> list[int]:
    """The indexes in the replay log, in list order (position must equal index)."""
    return [TokenEvent.from_log_entry(job_id, raw).index for raw in store.redis.lrange(
        keys.job_tokens(job_id), 0, -1
    )]  # fmt: skip


def result(output: str, tokens: int) -> JobResult:
    return JobResult(JobStatus.SUCCEEDED, output, FinishReason.LENGTH, tokens, time.time())


def stolen(store: JobStore, job: Job) -> tuple[Claim, Claim]:
    """Worker a claims the job, stalls past its lease, the sweep requeues it, b claims it."""
    first = store.leases.claim(job.id, "a", time.time(), lease_ms=30, max_attempts=5)
    assert first.claimed
    wait_for(lambda: not store.redis.exists(keys.job_lease(job.id)), 5, "a's lease to lapse")
    assert store.leases.recover_orphans(time.time()) == {job.id: "requeued"}
    second = store.leases.claim(job.id, "b", time.time(), lease_ms=60_000, max_attempts=5)
    assert second.claimed and second.fence != first.fence
    return first, second


def test_finish_with_a_stale_fence_is_refused(store: JobStore) -> None:
    job = new_job(store)
    first, second = stolen(store, job)
    assert not store.finish(job.id, first.fence, result("stale", 3))
    still = store.get(job.id)
    assert still is not None and still.status is JobStatus.RUNNING
    assert still.output == ""  # nothing of a's result landed
    assert store.finish(job.id, second.fence, result("fresh", 0))
    done = store.get(job.id)
    assert done is not None and done.status is JobStatus.SUCCEEDED and done.output == "fresh"
    # Once finished, even the holder of the last lease cannot rewrite the outcome.
    assert not store.finish(job.id, second.fence, result("again", 0))
    assert store.get(job.id).output == "fresh"  # type: ignore[union-attr]


def test_finish_with_a_fence_that_never_held_the_job_is_refused(store: JobStore) -> None:
    job = new_job(store)
    claim = store.leases.claim(job.id, "a", time.time(), lease_ms=60_000, max_attempts=5)
    assert not store.finish(job.id, "a:2", result("forged", 0))
    assert not store.finish(job.id, "", result("forged", 0))
    assert store.get(job.id).status is JobStatus.RUNNING  # type: ignore[union-attr]
    assert store.finish(job.id, claim.fence, result("mine", 0))


def test_a_token_append_retried_twice_leaves_no_duplicate(store: JobStore) -> None:
    job = new_job(store)
    claim = store.leases.claim(job.id, "a", time.time(), lease_ms=60_000, max_attempts=5)
    step = StepAppend(job.id, claim.fence, events(job.id, 0, 3))
    for _ in range(3):  # the first reply was lost, then the retry's reply too
        assert append(store, [step]).fenced_out == []
    assert log(store, job.id) == [0, 1, 2]
    # A retry that overlaps the log partly appends only the new tail.
    overlapping = StepAppend(job.id, claim.fence, events(job.id, 1, 4))
    assert append(store, [overlapping]).fenced_out == []
    assert append(store, [overlapping]).fenced_out == []
    assert log(store, job.id) == [0, 1, 2, 3, 4]
    snapshot, tail = store.snapshot(job.id, 3)
    assert snapshot is not None and snapshot.output == "".join(f"<{i}>" for i in range(5))
    assert [event.index for event in tail] == [3, 4]


def test_one_flush_of_many_jobs_is_fenced_per_job(store: JobStore) -> None:
    mine, lost = new_job(store), new_job(store)
    held = store.leases.claim(mine.id, "a", time.time(), lease_ms=60_000, max_attempts=5)
    stale, _ = stolen(store, lost)
    steps = [
        StepAppend(mine.id, held.fence, events(mine.id, 0, 2)),
        StepAppend(lost.id, stale.fence, events(lost.id, 0, 2)),
    ]
    assert append(store, steps).fenced_out == [lost.id]
    assert log(store, mine.id) == [0, 1]
    assert log(store, lost.id) == []


def test_a_stale_append_past_the_end_of_the_log_is_refused(store: JobStore) -> None:
    job = new_job(store)
    first, second = stolen(store, job)
    assert append(store, [StepAppend(job.id, second.fence, events(job.id, 0, 2))]).fenced_out == []
    # The stalled worker wakes with tokens the new owner has not written yet.
    stale = StepAppend(job.id, first.fence, events(job.id, 2, 3))
    assert append(store, [stale]).fenced_out == [job.id]
    assert log(store, job.id) == [0, 1]
    # And with tokens that would overwrite what the new owner wrote.
    assert append(store, [StepAppend(job.id, first.fence, events(job.id, 0, 4))]).fenced_out == [
        job.id
    ]
    assert log(store, job.id) == [0, 1]


def test_an_append_that_would_leave_a_gap_is_refused_and_names_the_logs_length(
    store: JobStore,
) -> None:
    # Position in the log is the token index: entries 5.. cannot follow entry 1. The lease
    # holder is told the log's length (Redis lost entries it had acknowledged: it sends them).
    job = new_job(store)
    claim = store.leases.claim(job.id, "a", time.time(), lease_ms=60_000, max_attempts=5)
    assert append(store, [StepAppend(job.id, claim.fence, events(job.id, 0, 2))]).fenced_out == []
    gap = StepAppend(job.id, claim.fence, events(job.id, 5, 2))
    outcome = append(store, [gap])
    assert outcome.fenced_out == [] and outcome.short_logs == {job.id: 2}
    assert log(store, job.id) == [0, 1]
    # Not this worker's lease: fenced out, its log's length is none of its business.
    forged = append(store, [StepAppend(job.id, "a:9", events(job.id, 5, 2))])
    assert forged.fenced_out == [job.id] and forged.short_logs == {}


def test_a_final_state_waits_for_the_tokens_its_worker_sent(store: JobStore) -> None:
    job = new_job(store)
    claim = store.leases.claim(job.id, "a", time.time(), lease_ms=60_000, max_attempts=5)
    append(store, [StepAppend(job.id, claim.fence, events(job.id, 0, 2))])
    pipe = store.redis.pipeline(transaction=False)
    store.queue_finish(pipe, job.id, claim.fence, result("<0><1><2>", 3), logged=3)
    (reply,) = pipe.execute()
    assert finish_outcome(reply) == 2  # the log's length; nothing stored
    assert store.status(job.id) is JobStatus.RUNNING
    append(store, [StepAppend(job.id, claim.fence, events(job.id, 2, 1))])
    assert store.finish(job.id, claim.fence, result("<0><1><2>", 3), logged=3)
    assert store.status(job.id) is JobStatus.SUCCEEDED


def test_a_stalled_workers_final_write_cannot_land(store: JobStore) -> None:
    """a stalls mid-job; b reruns and finishes it; a wakes and tries its last step and finish."""
    job = new_job(store)
    first, second = stolen(store, job)
    append(store, [StepAppend(job.id, second.fence, events(job.id, 0, 4))])
    assert store.finish(job.id, second.fence, result("<0><1><2><3>", 4))
    # a's last flush (tokens and final state in one pipeline, as the publisher sends them).
    pipe = store.redis.pipeline(transaction=False)
    last = StepAppend(job.id, first.fence, events(job.id, 4, 1))
    store.queue_step(pipe, [last])
    store.queue_finish(pipe, job.id, first.fence, result("a's answer", 5))
    step_reply, finished = pipe.execute()
    assert store.step_outcome([last], step_reply).fenced_out == [job.id]
    assert not finished
    done = store.get(job.id)
    assert done is not None and done.status is JobStatus.SUCCEEDED
    assert done.output == "<0><1><2><3>" and done.usage.completion_tokens == 4
    assert log(store, job.id) == [0, 1, 2, 3]
    # The finished job is no longer running, so no sweep can requeue it.
    assert store.redis.zscore(keys.running_jobs(keys.shard_of(job.id)), job.id) is None
    assert store.leases.recover_orphans(time.time()) == {}


def test_a_canceled_queued_job_cannot_be_claimed_or_written(store: JobStore) -> None:
    job = new_job(store)
    store.cancel(job.id, time.time())
    claim = store.leases.claim(job.id, "a", time.time(), lease_ms=60_000, max_attempts=5)
    assert not claim.claimed and claim.outcome == "canceled"
    assert append(store, [StepAppend(job.id, "a:1", events(job.id, 0, 1))]).fenced_out == [job.id]
    assert not store.finish(job.id, "a:1", result("late", 1))
    assert store.get(job.id).status is JobStatus.CANCELED  # type: ignore[union-attr]
