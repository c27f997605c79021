"""A queued job's place and expected start, read from a real Redis as a web process reads it.

Jobs are recorded by the store as the web tier records them, a worker's heartbeat and outlook
are written as a worker writes them, and a follower (its hub's subscription stood in for, as in
``test_hub``) must tell a waiter where it stands at connection and again every second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis
from flask import Flask

from tests.integration.test_hub import counting_snapshots, make_hub
from trickle import keys
from trickle.config.settings import Settings
from trickle.events import CLAIMED_MESSAGE
from trickle.jobs import Job, JobStatus, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import JobStore
from trickle.waiting import WorkerOutlook
from trickle.waiting_reader import (
    MAX_QUEUED_READ,
    MISS_REFRESH_SECONDS,
    READ_CHUNK,
    WaitEstimator,
    per_shard_read,
    publish_outlook,
    read_queued,
)
from web.services import services
from web.streams.follow import WAITING_REFRESH_SECONDS, JobFollower, KeepAlive, Status


@pytest.fixture
def store(private_redis: redis.Redis) -> JobStore:
    private_redis.flushdb()
    return JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=600)


def queue_jobs(store: JobStore, count: int, model: str = "demo") -> list[Job]:
    jobs = []
    for index in range(count):
        job = Job(
            new_job_id(),
            model,
            "hi",
            GenerationParams(max_tokens=10),
            created_at=time.time() + index * 0.001,
        )
        store.create(job)
        jobs.append(job)
    return jobs


def live_worker(client: redis.Redis, outlook: WorkerOutlook, model: str = "demo") -> None:
    """A worker's heartbeat and outlook, as its maintenance loop writes them."""
    pipe = client.pipeline(transaction=False)
    pipe.zadd(keys.model_workers(model), {"w1@h": time.time()})
    publish_outlook(pipe, "w1@h", {model: outlook}, ttl=10)
    pipe.execute()


def test_each_queued_job_gets_its_place_and_start(store: JobStore) -> None:
    jobs = queue_jobs(store, 3)
    queue_jobs(store, 2, model="other")  # another model's queue is no one's business here
    # One slot, free in 2 s; each job holds it 10 tokens x 0.1 s.
    live_worker(store.redis, WorkerOutlook(time.time(), (2.0,), 0.1))
    estimator = WaitEstimator(store.redis, heartbeat_ttl=10)
    found = [estimator.estimate(job.id) for job in jobs]
    assert [w.position for w in found if w] == [0, 1, 2]
    assert [w.eta_seconds for w in found if w] == pytest.approx([2.0, 3.0, 4.0], abs=0.1)
    assert 0 < store.redis.pttl(keys.worker_outlook("w1@h")) <= 10_000


def test_a_claimed_job_has_no_place_and_no_worker_means_no_start(store: JobStore) -> None:
    jobs = queue_jobs(store, 2)
    store.redis.zadd(keys.model_workers("demo"), {"w1@h": time.time()})  # no outlook yet
    claim = store.leases.claim(jobs[0].id, "w", time.time(), lease_ms=60_000, max_attempts=3)
    assert claim.claimed
    estimator = WaitEstimator(store.redis, heartbeat_ttl=10)
    assert estimator.estimate(jobs[0].id) is None
    waiting = estimator.estimate(jobs[1].id)
    assert waiting is not None and waiting.position == 0 and waiting.eta_seconds is None


def test_the_estimate_is_read_once_per_refresh_for_every_reader(store: JobStore) -> None:
    jobs = queue_jobs(store, 2)
    live_worker(store.redis, WorkerOutlook(time.time(), (1.0,), 0.1))
    estimator = WaitEstimator(store.redis, heartbeat_ttl=10, refresh_seconds=60)
    first = estimator.estimate(jobs[1].id)
    queue_jobs(store, 1)
    store.redis.delete(keys.job(jobs[0].id))  # unseen until the next refresh
    again = estimator.estimate(jobs[1].id)
    assert first is not None and again is not None
    assert again.position == first.position == 1
    assert again.eta_seconds is not None and first.eta_seconds is not None
    assert again.eta_seconds <= first.eta_seconds  # it ages with the snapshot


def test_a_long_queue_is_read_in_chunks_over_every_shard_in_order(store: JobStore) -> None:
    jobs = queue_jobs(store, READ_CHUNK * 2 + 7)  # three chunks, spread over the shards
    assert len({keys.shard_of(job.id) for job in jobs}) > 100
    # A job recorded before jobs kept ``max_tokens`` beside their params: read from them.
    store.redis.hdel(keys.job(jobs[3].id), "max_tokens")
    queued = read_queued(store.redis, MAX_QUEUED_READ)["demo"]
    assert [entry.job_id for entry in queued] == [job.id for job in jobs]
    assert {entry.max_tokens for entry in queued} == {10}
    assert read_queued(store.redis, 5)["demo"] == queued[:5]
    # Read two a shard at first: the shards holding more are read again, deeper.
    deepened = read_queued(store.redis, MAX_QUEUED_READ, per_shard=2)["demo"]
    assert deepened == queued


def test_one_shards_many_jobs_hide_no_later_ones(store: JobStore) -> None:
    """A request with an idempotency key puts all its jobs on that key's shard (16 prompts
    x n 8 = 128): its shard is read deeper, and the jobs behind it keep their estimate."""
    before = queue_jobs(store, 50)
    shard = keys.shard_of(before[0].id)
    crowd = []
    while len(crowd) < 128:
        job = Job(new_job_id(), "demo", "hi", GenerationParams(max_tokens=10))
        if keys.shard_of(job.id) == shard:
            job.created_at = time.time() + 1 + len(crowd) * 0.001
            store.create(job)
            crowd.append(job)
    after = queue_jobs(store, 50)
    for job in after:  # after the crowd
        store.redis.zincrby(keys.queued_jobs(keys.shard_of(job.id)), 2, job.id)
    everyone = [*before, *crowd, *after]
    assert [entry.job_id for entry in read_queued(store.redis, MAX_QUEUED_READ)["demo"]] == [
        job.id for job in everyone
    ]
    assert per_shard_read(MAX_QUEUED_READ) < 128 + 1
    found = WaitEstimator(store.redis, heartbeat_ttl=10).estimate(after[-1].id)
    assert found is not None and found.position == len(everyone) - 1


def test_a_batchs_next_start_reads_nothing_for_its_running_jobs(store: JobStore) -> None:
    jobs = queue_jobs(store, 2)
    estimator = WaitEstimator(store.redis, heartbeat_ttl=10, refresh_seconds=60)
    assert estimator.estimate(jobs[1].id) is not None  # the snapshot, read once
    claim = store.leases.claim(jobs[0].id, "w", time.time(), lease_ms=60_000, max_attempts=3)
    assert claim.claimed
    store.redis.delete(keys.job(jobs[1].id))  # a new read would no longer find it
    time.sleep(MISS_REFRESH_SECONDS)
    # A reader's miss reads again; a batch's, most of whose jobs ran or run, does not.
    found = estimator.first_of(["job-unknown", jobs[1].id])
    assert found is not None and found.position == 1
    assert estimator.estimate("job-unknown") is None  # read again: jobs[1] gone too
    assert estimator.first_of([jobs[1].id]) is None


def follow(store: JobStore, job: Job, statuses: bool) -> list[list[object]]:
    """The chunks a follower yields for a job that stays queued, for about two refreshes."""
    hub, _subscriber = make_hub()
    estimator = WaitEstimator(store.redis, heartbeat_ttl=10)
    follower = JobFollower(store, hub, job.id, -1, "", statuses, estimator)
    chunks = follower.chunks(keepalive_seconds=15)
    taken: list[list[object]] = []
    deadline = time.monotonic() + 2.5 * WAITING_REFRESH_SECONDS
    try:
        while time.monotonic() < deadline:
            taken.append(list(next(chunks)))
    finally:
        chunks.close()
    return taken


def test_a_native_reader_hears_its_place_at_once_and_every_second(store: JobStore) -> None:
    jobs = queue_jobs(store, 2)
    # Dated a minute ahead, so its estimate does not age while the test reads it.
    live_worker(store.redis, WorkerOutlook(time.time() + 60, (5.0,), 0.1))
    chunks = follow(store, jobs[1], statuses=True)
    assert len(chunks) >= 3  # at connection, then a refresh each second
    for chunk in chunks:
        (status,) = chunk
        assert isinstance(status, Status) and status.status is JobStatus.QUEUED
        assert status.position == 1
        assert status.eta_seconds == pytest.approx(6.0, abs=0.1)


def test_a_reader_without_statuses_hears_only_the_refreshes(store: JobStore) -> None:
    (job,) = queue_jobs(store, 1)
    live_worker(store.redis, WorkerOutlook(time.time() + 60, (5.0,), 0.1))
    chunks = follow(store, job, statuses=False)
    assert 2 <= len(chunks) <= 3  # nothing at connection; no keep-alive beside a refresh
    for chunk in chunks:
        (status,) = chunk
        assert not isinstance(status, KeepAlive)
        assert isinstance(status, Status) and status.position == 0


def test_a_waiting_readers_refreshes_read_the_estimate_not_the_job(store: JobStore) -> None:
    jobs = queue_jobs(store, 2)
    live_worker(store.redis, WorkerOutlook(time.time() + 60, (5.0,), 0.1))
    follower_store = JobStore(store.redis, result_ttl_seconds=60, queued_ttl_seconds=600)
    reads = counting_snapshots(follower_store)
    chunks = follow(follower_store, jobs[1], statuses=True)
    assert len(chunks) >= 3  # at connection, then a refresh each second
    assert all(chunk == [Status(JobStatus.QUEUED, 1, chunk[0].eta_seconds)] for chunk in chunks)
    # One read when it connected: a quiet second changes nothing a read would find (a claim,
    # a requeue and the end come as signals); the next read is due a keep-alive later.
    assert reads == [jobs[1].id]


def test_a_plain_readers_job_claimed_live_still_says_it_waits_for_a_lane(store: JobStore) -> None:
    """An OpenAI stream (no status events) of a job its worker claims at once and has wait for
    a lane hears where it stands every second, as while it was queued: not silence until its
    first token (its headers unsent meanwhile) or a keep-alive 15 s later."""
    (job,) = queue_jobs(store, 1)
    claimed_at = time.time() + 0.01
    # The outlook read as the claim comes does not account for it yet.
    live_worker(store.redis, WorkerOutlook(time.time() + 60, (5.0,), 0.1, claims_through=0.0))
    hub, _subscriber = make_hub()
    estimator = WaitEstimator(store.redis, heartbeat_ttl=10, models=["demo"])
    chunks = JobFollower(store, hub, job.id, -1, "", False, estimator).chunks(15)
    # Claimed before its reader's first refresh (a worker with room claims in milliseconds).
    time.sleep(0.01)
    assert store.leases.claim(job.id, "w", claimed_at, 60_000, max_attempts=3).claimed
    hub._dispatch(keys.job_events_channel(job.id), CLAIMED_MESSAGE)
    # The worker's next outlook, half a second on, has it wait 2 s for a lane.
    waiting = WorkerOutlook(
        time.time() + 60, (5.0,), 0.1, claimed_waiting=((job.id, 2.0),), claims_through=claimed_at
    )
    later = threading.Timer(0.6, live_worker, (store.redis, waiting))
    later.start()
    try:
        started = time.monotonic()
        (placed,) = next(chunks)
        assert time.monotonic() - started < 3 * WAITING_REFRESH_SECONDS
        assert isinstance(placed, Status) and placed.status is JobStatus.QUEUED
        assert placed.position == 0 and placed.eta_seconds == pytest.approx(2.0, abs=0.3)
    finally:
        later.join()
        chunks.close()


def test_a_job_claimed_after_the_outlooks_read_waits_until_one_says(store: JobStore) -> None:
    (job,) = queue_jobs(store, 1)
    live_worker(store.redis, WorkerOutlook(time.time() - 1, (5.0,), 0.1))  # before the claim
    assert store.leases.claim(job.id, "w", time.time(), lease_ms=60_000, max_attempts=3).claimed
    hub, _subscriber = make_hub()
    estimator = WaitEstimator(store.redis, heartbeat_ttl=10, models=["demo"])
    chunks = JobFollower(store, hub, job.id, -1, "", True, estimator).chunks(15)
    try:
        # Not "running": its worker may have it wait for a lane, and no outlook read says yet.
        assert next(chunks) == [Status(JobStatus.QUEUED)]
        # The worker's next outlook has it wait 2 s (dated ahead: its estimate does not age).
        waiting = WorkerOutlook(time.time() + 60, (5.0,), 0.1, claimed_waiting=((job.id, 2.0),))
        live_worker(store.redis, waiting)
        (placed,) = next(chunks)
        assert isinstance(placed, Status) and placed.status is JobStatus.QUEUED
        assert placed.position == 0 and placed.eta_seconds == pytest.approx(2.0, abs=0.1)
        live_worker(store.redis, WorkerOutlook(time.time() + 60, (5.0,), 0.1))  # in a batch
        assert next(chunks) == [Status(JobStatus.RUNNING)]
    finally:
        chunks.close()


def test_a_claim_is_seen_once_an_outlook_accounts_for_it(store: JobStore) -> None:
    claimed_at = time.time()
    estimator = WaitEstimator(store.redis, heartbeat_ttl=10, models=["demo"], refresh_seconds=0)
    assert estimator.claim_seen("demo", claimed_at)  # no live worker: nothing to wait for
    # Published after the claim, but its worker had not put the claim's jobs in its table.
    live_worker(
        store.redis, WorkerOutlook(claimed_at + 1, (5.0,), 0.1, claims_through=claimed_at - 1)
    )
    assert not estimator.claim_seen("demo", claimed_at)
    live_worker(store.redis, WorkerOutlook(claimed_at + 1, (5.0,), 0.1, claims_through=claimed_at))
    assert estimator.claim_seen("demo", claimed_at)


@pytest.fixture(scope="module")
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Flask:
    return make_app(settings)


def test_a_queued_job_and_a_background_response_say_where_they_stand(app: Flask) -> None:
    client = app.test_client()
    submitted = client.post("/v1/jobs", json={"model": "late", "prompt": "hi", "max_tokens": 10})
    assert submitted.status_code == 202
    assert "queued" not in submitted.get_json()  # a submission answers before any estimate
    job_id = submitted.get_json()["id"]
    unknown = client.get(f"/v1/jobs/{job_id}").get_json()["queued"]  # no worker serves "late"
    assert isinstance(unknown["position"], int) and unknown["eta_seconds"] is None
    client_redis = services(app).redis
    # A worker for "late", one slot free in 5 s (dated ahead: its estimate does not age).
    live_worker(client_redis, WorkerOutlook(time.time() + 60, (5.0,), 0.1), model="late")
    time.sleep(0.6)  # past the estimator's refresh
    queued = client.get(f"/v1/jobs/{job_id}").get_json()["queued"]
    assert queued["position"] == unknown["position"]
    assert queued["eta_seconds"] >= 5.0
    reply = client.post("/v1/responses", json={"model": "late", "input": "hi", "background": True})
    response_id = reply.get_json()["id"]
    time.sleep(0.6)
    found = client.get(f"/v1/responses/{response_id}").get_json()
    assert found["status"] == "queued"
    assert found["queued"]["position"] > queued["position"]  # submitted after the job
    assert found["queued"]["eta_seconds"] > queued["eta_seconds"]
    client.post(f"/v1/jobs/{job_id}/cancel")
    client.post(f"/v1/responses/{response_id}/cancel")
    gone = client.get(f"/v1/jobs/{job_id}").get_json()
    assert gone["status"] == "canceled" and "queued" not in gone
