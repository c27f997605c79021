"""A worker's maintenance duties against a real Redis: the orphan sweep and the lease renewal,
driven as the maintenance loop drives them (its thread not started), with the worker's own
callbacks recorded."""

from __future__ import annotations

import json
import logging
import time

import pytest
import redis

from trickle import keys
from trickle.config.settings import load_settings
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, Job, JobStatus, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import CancelOutcome, JobStore
from trickle.telemetry.metrics import MetricsRecorder
from worker.engine.scheduled import ScheduledJob
from worker.in_flight import InFlight
from worker.maintenance import Maintenance, WorkerDuties


class Calls:
    """What the maintenance asked of its worker."""

    def __init__(self) -> None:
        self.requeued: list[str] = []
        self.lost: list[str] = []

    def requeue(self, job_id: str) -> str:
        self.requeued.append(job_id)
        return "demo"


@pytest.fixture
def store(private_redis: redis.Redis) -> JobStore:
    """The module's Redis, emptied: a sweep acts on every running job it holds."""
    private_redis.flushdb()
    return JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)


def maintenance(
    private_redis: redis.Redis, store: JobStore, in_flight: InFlight, calls: Calls
) -> tuple[Maintenance, MetricsRecorder]:
    metrics = MetricsRecorder()
    duties = WorkerDuties(
        settings=load_settings(environ={}),
        node_name="sweeper",
        models=("demo",),
        redis=private_redis,
        store=store,
        metrics=metrics,
        in_flight=in_flight,
        slot_usage=dict,
        requeue=calls.requeue,
        queue_depth=lambda model: 0,
        lease_lost=calls.lost.append,
    )
    return Maintenance(duties), metrics


def claimed(store: JobStore, node: str = "dead") -> tuple[str, str]:
    """A job a worker ``node`` claimed: (id, fence)."""
    job = Job(new_job_id(), "demo", "hi", GenerationParams(), created_at=time.time())
    store.create(job)
    return job.id, store.leases.claim(job.id, node, time.time(), 60_000, 3).fence


def finish(store: JobStore, job: tuple[str, str]) -> None:
    """Its final state stored under its fence, as its worker's FINISH stores it."""
    result = JobResult(JobStatus.SUCCEEDED, "", FinishReason.LENGTH, 0, time.time())
    assert store.finish(job[0], job[1], result, logged=0)


def test_the_sweep_requeues_a_dead_workers_job_and_ends_a_canceled_one(
    private_redis: redis.Redis, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Leases lapsed: one job goes back to its queue (through the worker's requeue, so its
    task is published again), one whose cancel was pending ends canceled and is counted; a
    live lease and a job that finished are left alone and logged as nothing."""
    calls = Calls()
    sweeper, metrics = maintenance(private_redis, store, InFlight(), calls)
    orphan, canceled, alive, done = (claimed(store) for _ in range(4))
    assert store.cancel(canceled[0], time.time()) is CancelOutcome.REQUESTED
    finish(store, done)
    private_redis.delete(keys.job_lease(orphan[0]), keys.job_lease(canceled[0]))

    with caplog.at_level(logging.INFO, logger="trickle.jobs"):
        sweeper.sweep()

    assert calls.requeued == [orphan[0]]
    statuses = {job[0]: store.get(job[0]).status for job in (orphan, canceled, alive, done)}  # type: ignore[union-attr]
    assert statuses == {
        orphan[0]: JobStatus.QUEUED,
        canceled[0]: JobStatus.CANCELED,
        alive[0]: JobStatus.RUNNING,
        done[0]: JobStatus.SUCCEEDED,
    }
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "trickle.jobs"]
    assert {(line["job_id"], line["outcome"]) for line in lines} == {
        (orphan[0], "requeued"),
        (canceled[0], "canceled"),
    }
    assert all(line["event"] == "worker_lost" and line["swept_by"] == "sweeper" for line in lines)
    metrics.flush(private_redis)
    counters = private_redis.hgetall(keys.METRIC_COUNTERS)
    assert [value for name, value in counters.items() if "canceled" in name] == ["1"]
    sweeper.sweep()  # again: nothing left to recover
    assert calls.requeued == [orphan[0]]


def test_a_renewal_stops_only_the_copies_whose_lease_was_lost(
    private_redis: redis.Redis, store: JobStore
) -> None:
    """The worker's table still lists a job whose final state it just stored (its FINISH
    deleted the lease): the renewal must not take that for a lost lease and stop it."""
    calls = Calls()
    in_flight = InFlight()
    jobs = done, running, lapsed = [claimed(store, "me") for _ in range(3)]
    for job_id, fence in jobs:
        in_flight.add(ScheduledJob(job_id, fence, None, None), "demo")  # type: ignore[arg-type]
    renewer, _ = maintenance(private_redis, store, in_flight, calls)
    finish(store, done)
    private_redis.delete(keys.job_lease(lapsed[0]))
    private_redis.pexpire(keys.job_lease(running[0]), 1_000)

    renewer.renew_leases()

    assert calls.lost == [lapsed[0]]
    assert private_redis.pttl(keys.job_lease(running[0])) > 5_000  # renewed
