"""A Redis that lost its newest writes never ends a job before the tokens its worker sent.

Real Redis, the worker's own ``TokenPublisher`` and the store's scripts. Losing writes is done as
Redis loses them after a crash that its append-only file had not yet taken in: the replay log
and the output so far (written by one script) go back to an earlier length together, while the
job and its lease stay. The publisher must send the lost tokens again before the job's final
state, so its record's log length is the job's token count and a reader resuming past the
shortened log still gets every token, then the end. Without that, the final state landed over a
short log and such a reader got ``done`` with tokens missing (issue 44).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis

from tests.faultstack import wait_for
from tests.integration.test_done_record import Published
from tests.integration.test_hub import make_hub
from trickle import keys
from trickle.events import JobMessage, TokenEvent, TokenRun
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, Job, JobStatus, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import JobStore
from web.streams.follow import Done, JobFollower
from worker.publish_items import TokenItem
from worker.publisher import TokenPublisher

TOKENS = 12
KEPT = 4  # the log's length after the lost writes
FIRST_TOKEN_AT = 1_700_000_000.5


@pytest.fixture
def store(private_redis: redis.Redis) -> JobStore:
    return JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)


class Worker:
    """A claimed job and a real publisher, recording the callbacks a worker would get."""

    def __init__(self, store: JobStore):
        self.store = store
        self.job = Job(new_job_id(), "demo", "hi", GenerationParams(), created_at=time.time())
        store.create(self.job)
        claim = store.leases.claim(self.job.id, "w", time.time(), lease_ms=60_000, max_attempts=3)
        assert claim.claimed
        self.fence = claim.fence
        self.lost: list[str] = []
        self.publisher = TokenPublisher(store, lambda job_id: None, self.lost.append)

    def publish(self, first: int, last: int) -> None:
        """Tokens ``first`` to ``last`` (inclusive), one decoding step each."""
        for index in range(first, last + 1):
            event = TokenEvent(self.job.id, index, f"<{index}>", -0.5)
            first_token_at = FIRST_TOKEN_AT if index == 0 else None
            self.publisher.publish_step((TokenItem(event, self.fence, first_token_at),))

    def logged(self) -> int:
        return int(self.store.redis.llen(keys.job_tokens(self.job.id)))

    def lose_writes_after(self, kept: int) -> None:
        """What a crash without the last writes leaves: a shorter log and output, same lease."""
        if kept:
            self.store.redis.ltrim(keys.job_tokens(self.job.id), 0, kept - 1)
        else:
            self.store.redis.delete(keys.job_tokens(self.job.id))
        text = "".join(f"<{index}>" for index in range(kept))
        self.store.redis.set(keys.job_output(self.job.id), text)

    def finish(self) -> None:
        text = "".join(f"<{index}>" for index in range(TOKENS))
        result = JobResult(JobStatus.SUCCEEDED, text, FinishReason.LENGTH, TOKENS, time.time())
        assert self.publisher.publish_finish(self.job.id, self.fence, result).wait(10)

    def log_indexes(self) -> list[int]:
        entries = self.store.redis.lrange(keys.job_tokens(self.job.id), 0, -1)
        return [int(json.loads(entry)["index"]) for entry in entries]


@pytest.fixture
def worker(store: JobStore) -> Iterator[Worker]:
    running = Worker(store)
    yield running
    running.publisher.close()


def record_logged(messages: list[tuple[str, str]], channel: str) -> int:
    """The log length the job's done message carried on ``channel``."""
    (done,) = [data for name, data in messages if name == channel]
    record = JobMessage.decode(done).record
    assert record is not None
    return record.logged


def test_tokens_lost_mid_job_are_sent_again_with_the_next_flush(worker: Worker) -> None:
    worker.publish(0, 9)
    wait_for(lambda: worker.logged() == 10, 10, "the first ten tokens logged")
    worker.lose_writes_after(KEPT)
    published = Published(worker.store.redis, worker.job.id)
    worker.publish(10, TOKENS - 1)  # its first index is past the log's end: refused, repaired
    worker.finish()
    messages = published.take(3)  # the repair's tokens, then the record on both channels
    assert worker.log_indexes() == list(range(TOKENS))
    assert worker.lost == []  # the job kept its lease: nothing stopped, nothing requeued
    repair = JobMessage.decode(messages[0][1]).tokens
    assert repair is not None and list(repair.indexes) == list(range(KEPT, TOKENS))
    assert record_logged(messages, published.done) == TOKENS
    job = worker.store.get(worker.job.id)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert job.output == "".join(f"<{index}>" for index in range(TOKENS))


def test_a_final_state_over_a_short_log_waits_for_the_lost_tokens(worker: Worker) -> None:
    """The lost second took the job's last tokens and nothing came after them but its end."""
    worker.publish(0, TOKENS - 1)
    wait_for(lambda: worker.logged() == TOKENS, 10, "every token logged")
    worker.lose_writes_after(KEPT)
    hub, _ = make_hub()
    reader = JobFollower(worker.store, hub, worker.job.id, after=7)  # it saw 0..7 before
    published = Published(worker.store.redis, worker.job.id)
    worker.finish()
    messages = published.take(3)
    assert worker.log_indexes() == list(range(TOKENS))
    assert record_logged(messages, published.done) == TOKENS
    for channel, data in messages:
        hub._dispatch(channel, data)
    chunks = list(reader.chunks(1.0))
    runs = [event for chunk in chunks for event in chunk if isinstance(event, TokenRun)]
    assert [index for run in runs for index in run.indexes] == [8, 9, 10, 11]
    done = chunks[-1][-1]
    assert isinstance(done, Done) and done.job.usage.completion_tokens == TOKENS


def test_tokens_this_worker_never_sent_stop_the_job_instead(worker: Worker) -> None:
    """A log shorter than where this worker's run began (it resumed after tokens an earlier run
    sent, and Redis lost some of those): it cannot restore them, so it stops the job, whose
    lease then lapses and the sweep resumes it from the log, as after a worker crash."""
    worker.lose_writes_after(0)
    worker.publish(KEPT, KEPT + 1)  # a resumed run's first tokens, past an empty log
    wait_for(lambda: worker.lost == [worker.job.id], 10, "the job stopped")
    assert worker.logged() == 0


def test_a_job_that_lost_every_token_gets_them_and_its_first_token_time_back(
    worker: Worker,
) -> None:
    """The lost second held the job's first flush: the record's first-token time goes too."""
    worker.publish(0, 5)
    wait_for(lambda: worker.logged() == 6, 10, "the first tokens logged")
    worker.lose_writes_after(0)
    worker.store.redis.hdel(keys.job(worker.job.id), "first_token_at")
    worker.publish(6, TOKENS - 1)
    worker.finish()
    assert worker.log_indexes() == list(range(TOKENS))
    job = worker.store.get(worker.job.id)
    assert job is not None and job.first_token_at == FIRST_TOKEN_AT


def test_a_lost_final_state_is_stored_again_when_redis_restarted(worker: Worker) -> None:
    """Redis acknowledged the final state, then came back without it (and without the last
    tokens): the job is running under this worker's lease again. The heartbeat's news that
    Redis restarted sends the kept final state again, its tokens restored first."""
    worker.publish(0, TOKENS - 1)
    worker.finish()
    client = worker.store.redis
    client.hset(keys.job(worker.job.id), mapping={"status": "running", "owner": worker.fence})
    client.set(keys.job_lease(worker.job.id), worker.fence, px=60_000)
    worker.lose_writes_after(KEPT)
    published = Published(client, worker.job.id)
    worker.publisher.recheck_finished()
    messages = published.take(3)
    assert worker.log_indexes() == list(range(TOKENS))
    assert record_logged(messages, published.done) == TOKENS
    job = worker.store.get(worker.job.id)
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.attempts == 1


def test_a_recheck_of_a_final_state_that_survived_writes_nothing(worker: Worker) -> None:
    worker.publish(0, TOKENS - 1)
    worker.finish()
    before = worker.store.get(worker.job.id)
    published = Published(worker.store.redis, worker.job.id)
    worker.publisher.recheck_finished()
    assert published.take(1) == []  # no second record: its fence no longer matches
    assert worker.store.get(worker.job.id) == before
