"""The token plane on a real Redis, driven as a worker and a web process drive it: the real
JobStore and TokenPublisher on one side, the real TokenHub on the other (no engine, no HTTP).

A web process receives only the tokens of jobs its readers follow; a waiter hears only the end;
a GET reads the output, never the replay log; a broken subscription is taken again and its
readers told to re-read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tests.faultstack import wait_for
from trickle import keys
from trickle.events import TokenEvent
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, Job, JobStatus, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import JobStore
from trickle.store.leases import RecoveryOutcome
from web.streams.hub import Signal, TokenHub
from worker.publish_items import TokenItem
from worker.publisher import TokenPublisher


@pytest.fixture
def store(private_redis: redis.Redis) -> JobStore:
    return JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)


@pytest.fixture
def hub(private_redis: redis.Redis) -> Iterator[TokenHub]:
    port = private_redis.connection_pool.connection_kwargs["port"]
    hub = TokenHub(lambda: redis.Redis(port=port, decode_responses=True))
    yield hub
    hub.close()


@pytest.fixture
def publisher(store: JobStore) -> Iterator[TokenPublisher]:
    publisher = TokenPublisher(store, lambda job_id: None, lambda job_id: None)
    yield publisher
    publisher.close()


def running_job(store: JobStore) -> tuple[str, str]:
    job = Job(new_job_id(), "demo", "hi", GenerationParams(), created_at=time.time())
    store.create(job)
    claim = store.leases.claim(job.id, "w", time.time(), 60_000, 3)
    return job.id, claim.fence


def step(publisher: TokenPublisher, jobs: list[tuple[str, str]], index: int) -> None:
    publisher.publish_step(
        tuple(TokenItem(TokenEvent(job_id, index, f"<{index}>"), fence) for job_id, fence in jobs)
    )


def finish(publisher: TokenPublisher, job: tuple[str, str], count: int) -> None:
    output = "".join(f"<{i}>" for i in range(count))
    result = JobResult(JobStatus.SUCCEEDED, output, FinishReason.LENGTH, count, time.time())
    assert publisher.publish_finish(job[0], job[1], result).wait(10)


def test_a_web_process_receives_only_the_jobs_its_readers_follow(
    store: JobStore, hub: TokenHub, publisher: TokenPublisher
) -> None:
    followed, other = running_job(store), running_job(store)
    subscription = hub.subscribe(followed[0])
    for index in range(20):
        step(publisher, [followed, other], index)
    finish(publisher, followed, 20)
    finish(publisher, other, 20)
    seen: list[int] = []
    deliveries = subscription.get_all(5.0)
    while deliveries:
        seen += [i for d in deliveries if d.tokens is not None for i in d.tokens.indexes]
        if any(d.signal is Signal.DONE for d in deliveries):
            break
        deliveries = subscription.get_all(5.0)
    assert seen == list(range(20))
    subscription.close()
    # Everything that reached this process was the followed job's: its 20 tokens (in as many
    # messages as the publisher made flushes), then its end; none of the other job's 20.
    assert hub.received_tokens == 20
    assert 2 <= hub.received_messages <= 21


def test_a_waiter_hears_the_end_and_no_token(
    store: JobStore, hub: TokenHub, publisher: TokenPublisher
) -> None:
    job = running_job(store)
    waiter = hub.watch(job[0])
    for index in range(10):
        step(publisher, [job], index)
    finish(publisher, job, 10)
    delivery = waiter.get(5.0)
    assert delivery is not None and delivery.signal is Signal.DONE
    waiter.close()
    assert hub.received_tokens == 0 and hub.received_messages == 1


def test_a_get_reads_the_output_so_far_and_never_the_log(
    store: JobStore, publisher: TokenPublisher, private_redis: redis.Redis
) -> None:
    job = running_job(store)
    for index in range(5):
        step(publisher, [job], index)
    wait_for(lambda: private_redis.llen(keys.job_tokens(job[0])) == 5, 5, "five tokens")

    def log_reads() -> int:
        stats = private_redis.info("commandstats").get("cmdstat_lrange", {})
        return int(stats.get("calls", 0))

    before = log_reads()
    running = store.get(job[0])
    assert running is not None and running.output == "<0><1><2><3><4>"
    assert running.usage.completion_tokens == 5
    finish(publisher, job, 5)
    done = store.get(job[0])
    assert done is not None and done.status is JobStatus.SUCCEEDED and done.output == running.output
    assert log_reads() == before
    assert not private_redis.exists(keys.job_output(job[0]))  # the hash holds the output now


def test_a_broken_subscription_is_taken_again_and_its_readers_re_read(
    store: JobStore, hub: TokenHub, publisher: TokenPublisher, private_redis: redis.Redis
) -> None:
    job = running_job(store)
    subscription = hub.subscribe(job[0])
    step(publisher, [job], 0)
    assert [
        i for d in subscription.get_all(5.0) if d.tokens is not None for i in d.tokens.indexes
    ] == [0]
    private_redis.client_kill_filter(_type="pubsub")
    signals = wait_for(
        lambda: [d.signal for d in subscription.get_all(0.5) if d.signal is not None],
        10,
        "a resync",
    )
    assert Signal.RESYNC in signals
    wait_for(lambda: private_redis.pubsub_numsub(keys.job_events_channel(job[0]))[0][1], 10, "it")
    step(publisher, [job], 1)  # live again on the new connection
    got = wait_for(
        lambda: [i for d in subscription.get_all(0.5) if d.tokens for i in d.tokens.indexes],
        10,
        "1",
    )
    assert got == [1]
    subscription.close()


def test_a_job_whose_final_state_is_stored_has_lost_no_lease(
    store: JobStore, publisher: TokenPublisher, private_redis: redis.Redis
) -> None:
    """A renewal between a job's stored final state and its removal from the worker's jobs
    found the lease its FINISH deleted and took that for a lapse (a warning, a stop, a lapse
    forgiven: at 1.0x on the demo a dozen a run, every one of a finished job). The renewal
    now tells a job this fence ended from one whose lease lapsed or went to another attempt."""
    done, running, lapsed, taken = (running_job(store) for _ in range(4))
    step(publisher, [done, running, lapsed, taken], 0)
    result = JobResult(JobStatus.SUCCEEDED, "<0>", FinishReason.LENGTH, 1, time.time())
    assert publisher.publish_finish(done[0], done[1], result).wait(10)
    assert not private_redis.exists(keys.job_lease(done[0]))  # its FINISH deleted it
    private_redis.delete(keys.job_lease(lapsed[0]), keys.job_lease(taken[0]))
    # The lapsed job's sweep requeues it; here only ``taken`` is swept, claimed by another
    # worker and finished by it: its end is not this fence's.
    private_redis.zrem(keys.running_jobs(keys.shard_of(lapsed[0])), lapsed[0])
    assert store.leases.recover_orphans(time.time()) == {taken[0]: RecoveryOutcome.REQUEUED}
    again = store.leases.claim(taken[0], "w2", time.time(), 60_000, 3)
    assert publisher.publish_finish(taken[0], again.fence, result).wait(10)
    held = dict([done, running, lapsed, taken])
    assert sorted(store.leases.renew(held, 60_000)) == sorted([lapsed[0], taken[0]])
    assert private_redis.pttl(keys.job_lease(running[0])) > 50_000  # renewed
