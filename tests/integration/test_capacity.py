"""Queue depth over every priority, worker slots, and the autoscaler's decisions.

These tests put real Celery messages at both priorities and check that the depth (the broker's
own count, read through Celery), the 429 bound and the oldest-job age see them all.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest
import redis
from flask import Flask

from ops.autoscaler import WorkerRange, desired_workers, node_port
from ops.launcher import parse_concurrency
from ops.preload import expand
from trickle import capacity, keys
from trickle.capacity import ModelLoad, WorkerSlots
from trickle.config.sections import RedisSettings
from trickle.config.settings import Settings
from trickle.jobs import BATCH_PRIORITY, INTERACTIVE_PRIORITY, Job
from trickle.params import GenerationParams
from trickle.queue import QueueReader, enqueue_generation, make_celery
from trickle.store.job_store import JobStore


@pytest.fixture
def private_settings(settings: Settings, private_redis: redis.Redis) -> Settings:
    port = private_redis.connection_pool.connection_kwargs["port"]
    private_redis.flushdb()
    return dataclasses.replace(settings, redis=RedisSettings(url=f"redis://127.0.0.1:{port}/0"))


def store_of(client: redis.Redis) -> JobStore:
    return JobStore(client, result_ttl_seconds=60, queued_ttl_seconds=600)


def enqueue(
    client: redis.Redis, settings: Settings, job_id: str, priority: int, age: float
) -> None:
    job = Job(job_id, "demo", "x", GenerationParams(), created_at=time.time() - age)
    job.priority = priority
    store_of(client).create(job)
    enqueue_generation(make_celery(settings, settings.models), job_id, "demo", priority)


def test_depth_and_oldest_age_count_every_priority(
    private_settings: Settings, private_redis: redis.Redis
) -> None:
    for n in range(3):
        enqueue(private_redis, private_settings, f"job_i{n}", INTERACTIVE_PRIORITY, age=1.0)
    for n in range(2):
        enqueue(private_redis, private_settings, f"job_b{n}", BATCH_PRIORITY, age=30.0 - n)
    queues = QueueReader(
        make_celery(private_settings, private_settings.models), store_of(private_redis)
    )
    assert queues.depth("demo") == 5
    load = capacity.read_load(private_redis, "demo", 10.0, time.time(), queues)
    assert load.depth == 5 and load.demand == 5
    assert load.oldest_queued_seconds == pytest.approx(30.0, abs=1.0)
    assert queues.depth("late") == 0
    assert queues.oldest_queued_seconds("late", time.time()) == 0.0
    assert queues.batch_depth("demo") == 2
    assert queues.depth("demo", priority=INTERACTIVE_PRIORITY) == 3
    assert queues.depth("demo", priority=BATCH_PRIORITY) == 2
    assert (
        capacity.read_load(private_redis, "demo", 10.0, time.time(), queues, True).batch_depth == 2
    )


def test_the_queue_bound_counts_interactive_jobs_only(
    private_settings: Settings, private_redis: redis.Redis, make_app: Callable[[Settings], Flask]
) -> None:
    limits = dataclasses.replace(private_settings.limits, max_queued_jobs=3)
    app = make_app(dataclasses.replace(private_settings, limits=limits))
    for n in range(5):
        enqueue(private_redis, private_settings, f"job_b{n}", BATCH_PRIORITY, age=1.0)
    # Five batch jobs wait, more than the bound: an interactive job still gets in.
    assert app.test_client().post("/v1/jobs", json={"prompt": "The"}).status_code == 202
    for n in range(2):
        enqueue(private_redis, private_settings, f"job_i{n}", INTERACTIVE_PRIORITY, age=1.0)
    response = app.test_client().post("/v1/jobs", json={"prompt": "The"})
    assert response.status_code == 429
    error = response.get_json()["error"]
    assert error["code"] == "queue_full"
    assert "limits.max_queued_jobs = 3" in error["message"]
    assert "8" not in error["message"]  # the depth of every tenant's work is nobody's business


def test_worker_slots_come_from_live_heartbeats(private_redis: redis.Redis) -> None:
    now = time.time()
    heartbeats = {"worker-5100@h": now, "worker-5101@h": now - 60}
    private_redis.zadd(keys.model_workers("demo"), heartbeats)
    pipe = private_redis.pipeline()
    capacity.publish_slots(pipe, "worker-5100@h", {"demo": (3, 16)}, 0.0, 10.0)
    capacity.publish_slots(pipe, "worker-5101@h", {"demo": (0, 16)}, now - 70, 10.0)
    pipe.execute()
    assert 0 < private_redis.pttl(keys.worker_slots_key("worker-5100@h")) <= 10_000
    (live,) = capacity.live_worker_slots(private_redis, "demo", now - 10)
    assert live == WorkerSlots("worker-5100@h", 3, 16, 0.0)


def load(depth: int, busy: int = 0, total: int = 0, oldest: float = 0.0) -> ModelLoad:
    workers = [WorkerSlots("w", busy, total)] if total else []
    return ModelLoad("demo", depth, oldest, workers)


@pytest.mark.parametrize(
    ("model_load", "live", "starting", "want"),
    [
        (load(0), 0, 0, 0),  # idle: down to MIN
        (load(1), 0, 0, 1),  # a job on an empty pool starts one worker
        (load(50), 0, 0, 2),  # a burst: up to MAX at once
        (load(0, busy=3, total=16), 1, 0, 1),  # running jobs keep their worker
        (load(20, busy=16, total=16), 1, 0, 2),  # 36 slots wanted, 16 per worker
        (load(1, busy=16, total=16, oldest=3.0), 1, 0, 2),  # waiting too long, slots full
        (load(1, busy=16, total=16, oldest=3.0), 1, 1, 2),  # one already starting: no third
        (load(1, busy=2, total=16, oldest=3.0), 1, 0, 1),  # free slots: age is not capacity
    ],
)
def test_desired_workers(model_load: ModelLoad, live: int, starting: int, want: int) -> None:
    bounds = WorkerRange(0, 2)
    assert desired_workers([(model_load, 16)], bounds, live, starting, 2.0) == want


def test_worker_range_and_concurrency_parsing() -> None:
    assert WorkerRange.parse("0:2") == WorkerRange(0, 2)
    assert WorkerRange.parse("3") == WorkerRange(3, 3)
    for bad in ("2:1", "a:b", "-1:2", "0:0", ""):
        with pytest.raises(ValueError, match="MIN"):
            WorkerRange.parse(bad)
    assert parse_concurrency("worker=2, web=1") == {"worker": 2, "web": 1}
    with pytest.raises(ValueError, match="NAME=COUNT"):
        parse_concurrency("worker")
    assert node_port("worker-5101@host.example") == 5101 and node_port("main@host") is None
    assert expand('celery worker --hostname "worker-${PORT:-0}@%h" -x $HOME', {"HOME": "/h"}) == [
        "celery", "worker", "--hostname", "worker-0@%h", "-x", "/h"
    ]  # fmt: skip


def test_a_restarted_worker_drops_only_its_previous_lifes_leases(
    private_redis: redis.Redis,
) -> None:
    from trickle.store.job_store import JobStore
    from worker.reclaim import release_previous_life

    private_redis.flushdb()
    holders = {"job_a": "w-5100@h:1", "job_b": "w-5100@h2:1", "job_c": "w-51000@h:2"}
    for job_id, fence in holders.items():
        private_redis.set(keys.job_lease(job_id), fence, px=60_000)
        private_redis.zadd(keys.running_jobs(keys.shard_of(job_id)), {job_id: time.time()})
    store = JobStore(private_redis, result_ttl_seconds=60, queued_ttl_seconds=60)
    assert release_previous_life(store, "w-5100@h") == ["job_a"]
    assert private_redis.get(keys.job_lease("job_a")) is None
    assert private_redis.get(keys.job_lease("job_b")) == "w-5100@h2:1"
    assert private_redis.get(keys.job_lease("job_c")) == "w-51000@h:2"


@pytest.mark.parametrize(("cap", "want"), [(None, 2), (0, 0), (1, 1)])
def test_batch_demand_starts_at_most_max_batch_workers(cap: int | None, want: int) -> None:
    """None: batch demand is demand (up to MAX 2); 0: a batch backlog alone starts nothing."""
    batch_only = ModelLoad("demo", depth=40, oldest_queued_seconds=10.0, batch_depth=40)
    assert desired_workers([(batch_only, 16)], WorkerRange(0, 2), 0, 0, 2.0, cap) == want


def test_batch_keeps_the_worker_it_runs_on() -> None:
    """With cap 0 a busy worker (running batch jobs) is still wanted: it is not stopped."""
    running = ModelLoad("demo", 30, 10.0, [WorkerSlots("w-1@h", busy=16, total=16)], batch_depth=30)
    assert desired_workers([(running, 16)], WorkerRange(0, 4), 1, 0, 2.0, 0) == 1


def test_interactive_demand_is_never_capped() -> None:
    mixed = ModelLoad("demo", depth=40, oldest_queued_seconds=10.0, batch_depth=20)
    assert desired_workers([(mixed, 16)], WorkerRange(0, 4), 0, 0, 2.0, 0) == 2  # 20 of 40
