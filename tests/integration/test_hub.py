"""The web process's fan-out: one shared feed per job, a cursor per reader."""

from __future__ import annotations

import threading
import time

import redis

from trickle import keys
from trickle.events import (
    CLAIMED_MESSAGE,
    DONE_MESSAGE,
    STATUS_MESSAGE,
    TokenEvent,
    TokenRun,
    encode_text,
    token_message,
)
from trickle.jobs import Job, JobStatus, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import JobStore
from web.streams.follow import JobFollower, Status
from web.streams.hub import Delivery, Signal, TokenHub


class ManualSubscriber:
    """Stands in for the Redis subscription: these tests feed the hub by hand."""

    def __init__(self) -> None:
        self.wanted: dict[str, int] = {}

    def add(self, channel: str) -> threading.Event:
        self.wanted[channel] = self.wanted.get(channel, 0) + 1
        ready = threading.Event()
        ready.set()
        return ready

    def remove(self, channel: str) -> None:
        self.wanted[channel] -= 1
        if not self.wanted[channel]:
            del self.wanted[channel]


def make_hub() -> tuple[TokenHub, ManualSubscriber]:
    hub = TokenHub(lambda: None)
    subscriber = ManualSubscriber()
    hub._subscriber = subscriber  # type: ignore[assignment]
    return hub, subscriber


EVENTS = keys.job_events_channel("job_x")


def tokens(first: int, *texts: str) -> str:
    """A channel message carrying ``texts`` as tokens ``first`` onwards."""
    return token_message(first, [encode_text(text) for text in texts], [None] * len(texts))


def indexes(deliveries: list[Delivery]) -> list[int]:
    return [i for d in deliveries if d.tokens is not None for i in d.tokens.indexes]


DONE = keys.job_done_channel("job_x")


def counting_snapshots(store: JobStore) -> list[str]:
    """The ids of the jobs ``store`` re-reads (snapshots) from now on, in order."""
    reads: list[str] = []
    read = store.snapshot

    def counted(job_id: str, from_index: int) -> tuple[Job | None, list[TokenEvent]]:
        reads.append(job_id)
        return read(job_id, from_index)

    store.snapshot = counted  # type: ignore[method-assign]
    return reads


def test_every_reader_sees_every_delivery_from_when_it_subscribed() -> None:
    hub, _ = make_hub()
    early = hub.subscribe("job_x")
    hub._dispatch(EVENTS, tokens(0, "a"))
    late = hub.subscribe("job_x")
    hub._dispatch(EVENTS, tokens(1, "b", "c"))
    hub._dispatch(EVENTS, DONE_MESSAGE)
    seen_early = early.get_all(timeout=0.1)
    assert indexes(seen_early) == [0, 1, 2]
    assert seen_early[-1].signal is Signal.DONE
    assert indexes(late.get_all(timeout=0.1)) == [1, 2]
    assert early.get_all(timeout=0.01) == []


def test_a_message_costs_one_append_per_job_whatever_the_readers() -> None:
    hub, subscriber = make_hub()
    readers = [hub.subscribe("job_x") for _ in range(1000)]
    for index in range(50):
        hub._dispatch(EVENTS, tokens(index, "a"))
    assert len(hub._feeds["job_x"].deliveries) == 50  # shared, not copied per reader
    assert hub.active_subscriptions == 1000
    assert len(readers[-1].get_all(timeout=0.1)) == 50
    for reader in readers:
        reader.close()
    assert hub._feeds == {} and hub.active_subscriptions == 0
    assert subscriber.wanted == {}  # the channel goes with its last reader


def test_a_reconnect_tells_every_reader_to_resync() -> None:
    hub, _ = make_hub()
    reader = hub.subscribe("job_x")
    hub._broadcast(Delivery(signal=Signal.RESYNC))
    (delivery,) = reader.get_all(timeout=0.1)
    assert delivery.signal is Signal.RESYNC


def test_closing_a_subscription_again_never_counts_twice() -> None:
    hub, _ = make_hub()
    first, second = hub.subscribe("job_x"), hub.subscribe("job_x")
    for _ in range(3):
        first.close()  # the view, the stream's generator and follow_many may all close it
    assert hub.active_subscriptions == 1
    second.close()
    assert hub.active_subscriptions == 0


def test_a_waiter_hears_only_the_done_channel_and_is_no_stream() -> None:
    hub, subscriber = make_hub()
    waiter = hub.watch("job_x")
    assert subscriber.wanted == {DONE: 1} and hub.active_subscriptions == 0
    hub._dispatch(DONE, DONE_MESSAGE)
    (delivery,) = waiter.get_all(timeout=0.1)
    assert delivery.signal is Signal.DONE
    waiter.close()
    assert subscriber.wanted == {} and hub._feeds == {}


def test_a_message_for_a_job_nobody_follows_any_more_is_not_decoded() -> None:
    hub, _ = make_hub()
    hub._dispatch(EVENTS, "not json: never parsed")
    assert hub.received_messages == 1 and hub.received_tokens == 0


def test_a_channel_subscribed_again_tells_its_readers_to_resync() -> None:
    hub, _ = make_hub()
    reader = hub.subscribe("job_x")
    hub._resubscribed(EVENTS)
    (delivery,) = reader.get_all(timeout=0.1)
    assert delivery.signal is Signal.RESYNC


def test_a_reader_without_statuses_gets_tokens_and_costs_no_queue_position(
    private_redis: redis.Redis,
) -> None:
    """An OpenAI stream has no use for status events: its follower emits none, so the queue
    position (a script per stream) is never read for it, while a native stream still gets it."""
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    job = Job(new_job_id(), "demo", "The", GenerationParams(), created_at=time.time())
    store.create(job)
    hub, _ = make_hub()
    asked: list[str] = []
    read_position = store.queue_position

    def counted(job_id: str) -> int | None:
        asked.append(job_id)
        return read_position(job_id)

    store.queue_position = counted  # type: ignore[method-assign]
    native = JobFollower(store, hub, job.id, -1).chunks(1.0)
    assert next(native) == [Status(JobStatus.QUEUED, 0)]
    assert asked == [job.id]

    plain = JobFollower(store, hub, job.id, -1, statuses=False).chunks(1.0)
    token = TokenEvent(job.id, 0, "x")
    hub._dispatch(keys.job_events_channel(job.id), tokens(token.index, token.text))
    assert next(plain) == [TokenRun.from_events([token])]
    assert asked == [job.id]

    # A claim or a requeue is news only for status events: no re-read for this reader.
    snapshots = counting_snapshots(store)
    channel = keys.job_events_channel(job.id)
    hub._dispatch(channel, CLAIMED_MESSAGE)
    hub._dispatch(channel, STATUS_MESSAGE)
    later = TokenEvent(job.id, 1, "y")
    hub._dispatch(channel, tokens(later.index, later.text))
    assert next(plain) == [TokenRun.from_events([later])]
    assert snapshots == []
    native.close()
    plain.close()


def test_a_claim_is_news_without_a_read_and_a_requeue_is_read(private_redis: redis.Redis) -> None:
    """The claim message says all a reader shows (the job runs): its status event goes out
    without re-reading the job. A requeue ("s") still sends the reader to the job."""
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    job = Job(new_job_id(), "demo", "The", GenerationParams(), created_at=time.time())
    store.create(job)
    hub, _ = make_hub()
    native = JobFollower(store, hub, job.id, -1).chunks(1.0)
    (queued,) = next(native)  # its position counts the module's other queued jobs
    assert isinstance(queued, Status) and queued.status is JobStatus.QUEUED
    snapshots = counting_snapshots(store)
    channel = keys.job_events_channel(job.id)
    hub._dispatch(channel, CLAIMED_MESSAGE)
    assert next(native) == [Status(JobStatus.RUNNING)]
    first = TokenEvent(job.id, 0, "x")
    hub._dispatch(channel, tokens(first.index, first.text))
    assert next(native) == [TokenRun.from_events([first])]
    assert snapshots == []
    hub._dispatch(channel, STATUS_MESSAGE)  # requeued: the job says queued again
    assert next(native) == [queued]
    assert snapshots == [job.id]
    native.close()
