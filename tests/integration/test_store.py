"""JobStore transitions on a real Redis: claims, poison, recovery, hand-back, fencing."""

from __future__ import annotations

import time
from typing import Any

import redis

from tests.faultstack import wait_for
from trickle import keys
from trickle.events import TokenEvent
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, Job, JobStatus, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import JobStore, StepAppend


def stored_job(store: JobStore) -> Job:
    job = Job(new_job_id(), "demo", "hi", GenerationParams(), created_at=time.time())
    store.create(job)
    return job


def test_claim_fences_and_recovery_requeues(private_redis: redis.Redis) -> None:
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    job = stored_job(store)
    first = store.leases.claim(job.id, "a", time.time(), lease_ms=50, max_attempts=2)
    assert first.claimed and first.fence == "a:1"
    assert not store.leases.claim(job.id, "b", time.time(), lease_ms=50, max_attempts=2).claimed
    wait_for(lambda: not private_redis.exists(keys.job_lease(job.id)), 5, "a's lease to lapse")
    assert store.leases.recover_orphans(time.time()) == {job.id: "requeued"}
    second = store.leases.claim(job.id, "b", time.time(), lease_ms=5000, max_attempts=2)
    assert second.fence == "b:2"
    # The first worker wakes up: its writes are refused.
    stale = StepAppend(job.id, first.fence, [TokenEvent(job.id, 0, "x")])
    pipe = private_redis.pipeline(transaction=False)
    store.queue_step(pipe, [stale])
    (reply,) = pipe.execute()
    assert store.step_outcome([stale], reply).fenced_out == [job.id]
    assert private_redis.llen(keys.job_tokens(job.id)) == 0


def test_third_claim_past_max_attempts_fails_the_job(private_redis: redis.Redis) -> None:
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    job = stored_job(store)
    for _ in range(2):  # two attempts whose worker "dies" (the lease lapses)
        assert store.leases.claim(job.id, "w", time.time(), lease_ms=1, max_attempts=2).claimed
        wait_for(lambda: not private_redis.exists(keys.job_lease(job.id)), 5, "the lease lapse")
        store.leases.recover_orphans(time.time())
    assert (
        store.leases.claim(job.id, "w", time.time(), lease_ms=1, max_attempts=2).outcome
        == "poisoned"
    )
    failed = store.get(job.id)
    assert failed is not None and failed.status is JobStatus.FAILED
    assert failed.error is not None and failed.error.type == "worker_lost"


def test_hand_back_respects_a_pending_cancel(private_redis: redis.Redis) -> None:
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    plain, canceled = stored_job(store), stored_job(store)
    claims = {j.id: store.leases.claim(j.id, "w", time.time(), 5000, 3) for j in (plain, canceled)}
    store.cancel(canceled.id, time.time())  # running: only a request
    assert store.leases.release(plain.id, claims[plain.id].fence, time.time()) == "queued"
    assert store.leases.release(canceled.id, claims[canceled.id].fence, time.time()) == "canceled"
    assert store.leases.release(plain.id, claims[plain.id].fence, time.time()) == "lost"
    states = {j.id: store.get(j.id) for j in (plain, canceled)}
    assert states[plain.id].status is JobStatus.QUEUED  # type: ignore[union-attr]
    assert states[plain.id].attempts == 0  # type: ignore[union-attr]
    assert states[canceled.id].status is JobStatus.CANCELED  # type: ignore[union-attr]


def test_queue_position_counts_earlier_submissions_across_shards(
    private_redis: redis.Redis,
) -> None:
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    jobs = []
    for _ in range(6):
        jobs.append(stored_job(store))
        time.sleep(0.002)  # distinct submission times: queue deadlines order them
    assert len({keys.shard_of(job.id) for job in jobs}) > 1  # the count spans shards
    base = store.queue_position(jobs[0].id)  # jobs earlier tests left queued come first
    assert base is not None
    assert [store.queue_position(job.id) for job in jobs] == [base + i for i in range(6)]
    assert store.leases.claim(jobs[0].id, "a", time.time(), lease_ms=5000, max_attempts=2).claimed
    assert store.queue_position(jobs[0].id) is None  # running: no longer queued
    assert store.queue_position(jobs[3].id) == base + 2

    def counted(index: Any) -> int:
        return sum(private_redis.zcard(index(shard)) for shard in range(keys.SHARDS))

    assert store.queued_count() == counted(keys.queued_jobs) >= 5
    assert store.running_count() == counted(keys.running_jobs) >= 1


def test_claim_many_claims_each_job_once_in_one_call(private_redis: redis.Redis) -> None:
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    jobs = [stored_job(store) for _ in range(3)]
    ids = [job.id for job in jobs]
    claims = store.leases.claim_many(ids, "feeder", time.time(), lease_ms=5000, max_attempts=2)
    assert [claim.claimed for claim in claims] == [True, True, True]
    assert [claim.fence for claim in claims] == ["feeder:1"] * 3
    assert [claim.job.id for claim in claims if claim.job] == ids
    again = store.leases.claim_many(ids, "other", time.time(), lease_ms=5000, max_attempts=2)
    assert not any(claim.claimed for claim in again)  # running under feeder's lease
    assert store.leases.claim(ids[0], "other", time.time(), 5000, 2).outcome == again[0].outcome


def died_after(store: JobStore, job: Job, attempts: int, tokens: list[list[TokenEvent]]) -> None:
    """``attempts`` claims of ``job`` whose worker appended its share of ``tokens`` (one list
    per attempt) and died: each lease lapses and the sweep requeues the job."""
    for attempt in range(attempts):
        claim = store.leases.claim(job.id, f"w{attempt}", time.time(), lease_ms=50, max_attempts=3)
        assert claim.claimed
        if tokens[attempt]:
            append = StepAppend(job.id, claim.fence, tokens[attempt])
            pipe = store.redis.pipeline(transaction=False)
            store.queue_step(pipe, [append])
            (reply,) = pipe.execute()
            assert store.step_outcome([append], reply).fenced_out == []
        wait_for(lambda: not store.redis.exists(keys.job_lease(job.id)), 5, "the lease lapse")
        assert store.leases.recover_orphans(time.time()).get(job.id) == "requeued"


def test_a_job_every_token_of_which_is_stored_is_claimed_to_finish_not_failed(
    private_redis: redis.Redis,
) -> None:
    """Its third worker died after logging the last of its max_tokens: the next claim is not a
    fourth attempt (attempts count deaths during generation), it is never poisoned, and the
    worker that holds it stores it as it stands."""
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    job = Job(new_job_id(), "demo", "hi", GenerationParams(max_tokens=3), created_at=time.time())
    store.create(job)
    events = [TokenEvent(job.id, i, f"t{i}") for i in range(3)]  # no end mark: by length alone
    died_after(store, job, 3, [events[:1], events[1:2], events[2:]])
    for _ in range(2):  # a finalizing worker may die too: still no attempt counted
        claim = store.leases.claim(job.id, "final", time.time(), lease_ms=50, max_attempts=3)
        assert claim.claimed and claim.logged_tokens == 3
        assert claim.fence == "final:4"
        assert private_redis.hget(keys.job(job.id), "attempts") == "3"
        wait_for(lambda: not private_redis.exists(keys.job_lease(job.id)), 5, "the lease lapse")
        store.leases.recover_orphans(time.time())
    claim = store.leases.claim(job.id, "final", time.time(), lease_ms=5000, max_attempts=3)
    result = JobResult(JobStatus.SUCCEEDED, "t0t1t2", FinishReason.LENGTH, 3, time.time())
    assert store.finish(job.id, claim.fence, result, logged=0)
    finished = store.get(job.id)
    assert finished is not None and finished.status is JobStatus.SUCCEEDED
    assert finished.output == "t0t1t2" and finished.attempts == 3 and finished.error is None


def test_a_job_that_finished_under_the_sweeps_read_is_no_lost_worker(
    private_redis: redis.Redis,
) -> None:
    """The sweep reads the running jobs, then their leases; a job whose FINISH came in between
    (it deletes both) has no lease but lost no worker: the sweep reports nothing for it and
    leaves its result alone. Replayed by putting the finished job back among the running."""
    private_redis.flushdb()  # the module's other tests leave running jobs, in any shard
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    job = stored_job(store)
    claim = store.leases.claim(job.id, "w", time.time(), lease_ms=5000, max_attempts=2)
    result = JobResult(JobStatus.SUCCEEDED, "t0", FinishReason.LENGTH, 1, time.time())
    assert store.finish(job.id, claim.fence, result, logged=0)
    running = keys.running_jobs(keys.shard_of(job.id))
    private_redis.zadd(running, {job.id: time.time()})  # as the sweep's earlier read saw it
    assert store.leases.recover_orphans(time.time()) == {}
    assert private_redis.zcard(running) == 0
    finished = store.get(job.id)
    assert finished is not None and finished.status is JobStatus.SUCCEEDED
    assert finished.output == "t0" and finished.error is None


def test_a_job_whose_end_token_is_stored_is_claimed_to_finish(private_redis: redis.Redis) -> None:
    """Ended early (its end token or a stop string, marked on its last entry): complete with
    fewer than max_tokens, so no later claim counts an attempt. A log without that mark is a
    death during generation: after three deaths that logged nothing more, poisoned."""
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    ended, cut = (
        Job(new_job_id(), "demo", "hi", GenerationParams(max_tokens=50), created_at=time.time())
        for _ in range(2)
    )
    for job, end in ((ended, FinishReason.STOP), (cut, None)):
        store.create(job)
        # Its text looks like the mark: only an unescaped key is one.
        text = '"end": "stop"'
        last = TokenEvent(job.id, 1, text, end=end, stop_sequence="\n" if end else "")
        died_after(store, job, 4, [[TokenEvent(job.id, 0, "a"), last], [], [], []])
    claim = store.leases.claim(ended.id, "w", time.time(), lease_ms=5000, max_attempts=3)
    assert claim.claimed and claim.attempt == 2
    assert store.tokens(ended.id)[-1].end is FinishReason.STOP
    assert store.tokens(ended.id)[-1].stop_sequence == "\n"
    assert private_redis.hget(keys.job(ended.id), "attempts") == "1"
    poisoned = store.leases.claim(cut.id, "w", time.time(), lease_ms=5000, max_attempts=3)
    assert poisoned.outcome == "poisoned"
    failed = store.get(cut.id)
    assert failed is not None and failed.status is JobStatus.FAILED


def test_only_deaths_that_logged_no_token_count_toward_max_attempts(
    private_redis: redis.Redis,
) -> None:
    """Five workers die, each after logging a token (a saturated machine, its kills): the job
    is claimed again every time under a new fence, never poisoned. Then three deaths that log
    nothing more (a job that kills its worker at one point) poison it at max_attempts 3; a
    hand-back between them is no death."""
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    job = Job(new_job_id(), "demo", "hi", GenerationParams(max_tokens=50), created_at=time.time())
    store.create(job)
    died_after(store, job, 5, [[TokenEvent(job.id, i, f"t{i}")] for i in range(5)])
    fences = set()
    for _ in range(2):  # two deaths with nothing logged: counted, not yet poisoned
        claim = store.leases.claim(job.id, "w", time.time(), lease_ms=50, max_attempts=3)
        assert claim.claimed and claim.logged_tokens == 5
        fences.add(claim.fence)
        wait_for(lambda: not private_redis.exists(keys.job_lease(job.id)), 5, "the lease lapse")
        assert store.leases.recover_orphans(time.time()).get(job.id) == "requeued"
    handed = store.leases.claim(job.id, "w", time.time(), lease_ms=5000, max_attempts=3)
    assert handed.claimed and handed.fence not in fences
    assert store.leases.release(job.id, handed.fence, time.time()) == "queued"
    assert private_redis.hget(keys.job(job.id), "stalled_attempts") == "2"
    last = store.leases.claim(job.id, "w", time.time(), lease_ms=50, max_attempts=3)
    assert last.claimed and last.attempt == 8  # every claim numbers its fence
    wait_for(lambda: not private_redis.exists(keys.job_lease(job.id)), 5, "the lease lapse")
    store.leases.recover_orphans(time.time())
    poisoned = store.leases.claim(job.id, "w", time.time(), lease_ms=5000, max_attempts=3)
    assert poisoned.outcome == "poisoned"
    failed = store.get(job.id)
    assert failed is not None and failed.status is JobStatus.FAILED
    assert failed.output == "t0t1t2t3t4" and failed.error is not None
    assert failed.error.message == "its worker died 3 times before the job made progress"


def lapse(store: JobStore, job: Job, node: str) -> str:
    """Claim the job as ``node`` under a short lease, let it lapse and sweep: its fence."""
    claim = store.leases.claim(job.id, node, time.time(), lease_ms=20, max_attempts=2)
    assert claim.claimed
    wait_for(lambda: not store.redis.exists(keys.job_lease(job.id)), 5, "the lease lapse")
    assert store.leases.recover_orphans(time.time()).get(job.id) == "requeued"
    return claim.fence


def test_a_lapse_whose_worker_was_alive_is_no_death(private_redis: redis.Redis) -> None:
    """A starved worker (a saturated machine) renews too late, again and again, and says so
    each time (before the next claim, or after it): the job is never poisoned, at max_attempts
    2 after five such lapses. A lapse nobody reports still counts, and poisons it."""
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    job = stored_job(store)
    for round_ in range(5):
        fence = lapse(store, job, f"starved{round_}")
        if round_ % 2:  # it wakes after the next claim, which counted its lapse: taken back
            other = lapse(store, job, "other")
            assert private_redis.hget(keys.job(job.id), "stalled_attempts") == "1"
            assert store.leases.forgive_lapse(job.id, fence, max_attempts=3)
            assert private_redis.hget(keys.job(job.id), "stalled_attempts") == "0"
            fence = other
        # It wakes before the next claim: nothing was counted, and that claim counts nothing.
        assert not store.leases.forgive_lapse(job.id, fence, max_attempts=3)
    assert private_redis.hget(keys.job(job.id), "status") == "queued"
    lapse(store, job, "dead")  # this one dies for real and never says so
    lapse(store, job, "dead")
    poisoned = store.leases.claim(job.id, "w", time.time(), lease_ms=5000, max_attempts=2)
    assert poisoned.outcome == "poisoned"


def test_lapses_past_the_forgiven_bound_count_again(private_redis: redis.Redis) -> None:
    """A job whose every worker lapses alive (it starves them) is forgiven only so often:
    three lapses per allowed death, then its lapses count, and it is failed."""
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    job = stored_job(store)
    for round_ in range(5):
        fence = lapse(store, job, f"starved{round_}")
        store.leases.forgive_lapse(job.id, fence, max_attempts=1)  # 3 forgiven at most
    assert private_redis.hget(keys.job(job.id), "forgiven_lapses") == "5"
    poisoned = store.leases.claim(job.id, "w", time.time(), lease_ms=5000, max_attempts=2)
    assert poisoned.outcome == "poisoned"
