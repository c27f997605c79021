"""A finished job's done message carries its record: readers that heard every token end on it.

Real Redis and the store's own scripts: the job is claimed, gets tokens and is finished as a
worker does it, and the messages Redis published are fed to a web process's hub (its Redis
subscription stood in for, as in ``test_hub``). The record must be exactly what a read gives,
and a reader missing a token must still read the log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from tests.integration.test_hub import counting_snapshots, make_hub
from trickle import keys
from trickle.events import JobMessage, TokenEvent, TokenRun
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, Job, JobStatus, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import JobStore, StepAppend
from web.streams.follow import Done, JobFollower, Status
from web.streams.job_wait import wait_for_job

TEXTS = ["Caf", 'é "quoted"\n', "/ end"]  # escaping: non-ASCII, quotes, a newline, a slash


@pytest.fixture
def store(private_redis: redis.Redis) -> JobStore:
    return JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)


class Published:
    """Every message Redis publishes on a job's events and done channels, in order."""

    def __init__(self, client: redis.Redis, job_id: str):
        self.events = keys.job_events_channel(job_id)
        self.done = keys.job_done_channel(job_id)
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(self.events, self.done)
        time.sleep(0.05)

    def take(self, count: int) -> list[tuple[str, str]]:
        taken: list[tuple[str, str]] = []
        deadline = time.monotonic() + 5
        while len(taken) < count and time.monotonic() < deadline:
            message = self._pubsub.get_message(timeout=0.5)
            if message is not None:
                taken.append((str(message["channel"]), str(message["data"])))
        self._pubsub.close()
        return taken


def run_job(store: JobStore) -> tuple[Job, Iterator[tuple[str, str]], list[tuple[str, str]]]:
    """A job claimed, given three tokens (one flush) and finished; the messages published on its
    channels after the claim: the token message, then the record on events and on done."""
    job = Job(new_job_id(), "demo", "hi", GenerationParams(), created_at=time.time())
    store.create(job)
    claim = store.leases.claim(job.id, "w", time.time(), lease_ms=60_000, max_attempts=3)
    assert claim.claimed
    published = Published(store.redis, job.id)
    events = [TokenEvent(job.id, index, text) for index, text in enumerate(TEXTS)]
    pipe = store.redis.pipeline(transaction=False)
    store.queue_step(pipe, [StepAppend(job.id, claim.fence, events, time.time())])
    pipe.execute()
    finished = JobResult(JobStatus.SUCCEEDED, "".join(TEXTS), FinishReason.LENGTH, 3, time.time())
    assert store.finish(job.id, claim.fence, finished)
    messages = published.take(3)
    return job, iter(messages), messages


def test_the_done_message_is_the_record_a_read_gives_on_both_channels(store: JobStore) -> None:
    job, _, messages = run_job(store)
    (_, token), (events_channel, on_events), (done_channel, on_done) = messages
    assert JobMessage.decode(token).tokens is not None
    assert (events_channel, done_channel) == (
        keys.job_events_channel(job.id),
        keys.job_done_channel(job.id),
    )
    assert on_events == on_done
    decoded = JobMessage.decode(on_done)
    assert decoded.done and decoded.record is not None
    assert decoded.record.logged == 3
    assert decoded.record.job == store.get(job.id)
    assert decoded.record.job.output == "".join(TEXTS)


def test_a_reader_with_every_token_ends_on_the_record_without_reading_again(
    store: JobStore,
) -> None:
    job, _, messages = run_job(store)
    hub, _ = make_hub()
    # The reader connected after the claim, before the first token.
    store.redis.delete(keys.job_tokens(job.id))
    store.redis.hset(keys.job(job.id), "status", JobStatus.RUNNING.value)
    follower = JobFollower(store, hub, job.id, -1)
    reads = counting_snapshots(store)
    for channel, data in messages[:2]:  # the token message, then the record on events
        hub._dispatch(channel, data)
    chunks = list(follower.chunks(1.0))
    done = chunks[-1][-1]
    assert isinstance(done, Done)
    streamed = [event for chunk in chunks for event in chunk if isinstance(event, TokenRun)]
    assert "".join(run.text for run in streamed) == "".join(TEXTS) == done.job.output
    assert reads == []  # the first snapshot only, taken before counting began
    assert done.job.status is JobStatus.SUCCEEDED and done.job.usage.completion_tokens == 3


def test_a_reader_that_missed_a_token_reads_the_log(store: JobStore) -> None:
    job, _, messages = run_job(store)
    hub, _ = make_hub()
    tokens_key = keys.job_tokens(job.id)
    logged = store.redis.lrange(tokens_key, 0, -1)
    store.redis.delete(tokens_key)
    store.redis.hset(keys.job(job.id), "status", JobStatus.RUNNING.value)
    follower = JobFollower(store, hub, job.id, -1)
    store.redis.rpush(tokens_key, *logged)
    store.redis.hset(keys.job(job.id), "status", JobStatus.SUCCEEDED.value)
    reads = counting_snapshots(store)
    hub._dispatch(*messages[1])  # the record, the token message lost
    chunks = list(follower.chunks(1.0))
    done = chunks[-1][-1]
    assert isinstance(done, Done) and reads == [job.id]
    streamed = [event for chunk in chunks for event in chunk if isinstance(event, TokenRun)]
    assert "".join(run.text for run in streamed) == "".join(TEXTS)
    assert done.job == store.get(job.id)


def test_a_waiter_returns_the_record_without_reading_the_job(store: JobStore) -> None:
    job, _, messages = run_job(store)
    hub, _ = make_hub()
    store.redis.hset(keys.job(job.id), "status", JobStatus.RUNNING.value)
    gets: list[str] = []
    get = store.get

    def counted(job_id: str) -> Job | None:
        gets.append(job_id)
        return get(job_id)

    store.get = counted  # type: ignore[method-assign]

    def finish_later() -> None:
        time.sleep(0.2)
        store.redis.hset(keys.job(job.id), "status", JobStatus.SUCCEEDED.value)
        hub._dispatch(*messages[2])  # the record on the done channel

    threading.Thread(target=finish_later).start()
    waited = wait_for_job(store, hub, job.id, 5.0)
    assert gets == []
    assert waited is not None and waited == get(job.id)
    assert waited.status is JobStatus.SUCCEEDED


def test_a_reader_that_last_heard_queued_hears_running_before_the_tokens(
    store: JobStore,
) -> None:
    """A short job's claim, tokens and end can reach a reader in one wake-up: "running" still
    goes out, before the tokens, and the final status after them (a fast demo job's reader
    heard queued, then succeeded)."""
    job, _, messages = run_job(store)
    hub, _ = make_hub()
    store.redis.delete(keys.job_tokens(job.id))
    store.redis.hset(keys.job(job.id), "status", JobStatus.QUEUED.value)  # as it connected
    follower = JobFollower(store, hub, job.id, -1)
    for channel, data in messages[:2]:
        hub._dispatch(channel, data)
    events = [event for chunk in follower.chunks(1.0) for event in chunk]
    kinds = [
        event.status.value if isinstance(event, Status) else type(event).__name__
        for event in events
    ]
    assert kinds == ["queued", "running", "TokenRun", "succeeded", "Done"], kinds
