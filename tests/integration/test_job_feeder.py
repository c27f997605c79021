"""The worker's own consumer of generation tasks, on a real Redis: what it takes, in which order,
and how a lost worker's taken messages go back (the end-to-end paths run in every stack test)."""

from __future__ import annotations

import json
import threading
import time

import redis

from tests.faultstack import wait_for
from worker import keys
from worker.capacity import message_job_id
from worker.job_feeder import GIVE_BACK, TAKE, JobFeeder, return_dead_feeders
from worker.queueing import GenerationPusher

INTERACTIVE = keys.model_queue_list("demo", 0)
BATCH = keys.model_queue_list("demo", 9)


def message(job_id: str, priority: int = 0) -> str:
    return json.dumps(GenerationPusher(redis.Redis(), "r").message(job_id, "demo", priority))


def fresh(client: redis.Redis, *names: str) -> None:
    client.delete(INTERACTIVE, BATCH, keys.FEEDERS, *(keys.worker_taken(n) for n in names))


def test_take_moves_at_most_room_messages_oldest_and_most_urgent_first(
    private_redis: redis.Redis,
) -> None:
    fresh(private_redis, "a")
    for job in ("i1", "i2", "i3"):
        private_redis.lpush(INTERACTIVE, message(job))  # LPUSH: the oldest is at the tail
    private_redis.lpush(BATCH, message("b1", 9))
    take = private_redis.register_script(TAKE)
    first = take(keys=[keys.worker_taken("a"), INTERACTIVE, BATCH], args=[2])
    assert [message_job_id(entry.partition("\n")[2]) for entry in first] == ["i1", "i2"]
    second = take(keys=[keys.worker_taken("a"), INTERACTIVE, BATCH], args=[5])
    assert [message_job_id(entry.partition("\n")[2]) for entry in second] == ["i3", "b1"]
    assert [entry.partition("\n")[0] for entry in second] == [INTERACTIVE, BATCH]
    assert private_redis.llen(INTERACTIVE) == private_redis.llen(BATCH) == 0
    assert private_redis.lrange(keys.worker_taken("a"), 0, -1) == [*first, *second]
    # Given back, each message is at the tail of its own queue again, in the original order.
    private_redis.lpush(INTERACTIVE, message("i4"))
    assert private_redis.register_script(GIVE_BACK)(keys=[keys.worker_taken("a")]) == 4
    queued = [message_job_id(m) for m in reversed(private_redis.lrange(INTERACTIVE, 0, -1))]
    assert queued == ["i1", "i2", "i3", "i4"]  # next out first
    assert [message_job_id(m) for m in private_redis.lrange(BATCH, 0, -1)] == ["b1"]
    assert not private_redis.exists(keys.worker_taken("a"))


def test_only_dead_feeders_give_back(private_redis: redis.Redis) -> None:
    fresh(private_redis, "alive", "dead")
    take = private_redis.register_script(TAKE)
    for node, job in (("alive", "x1"), ("dead", "x2")):
        private_redis.sadd(keys.FEEDERS, node)
        private_redis.lpush(INTERACTIVE, message(job))
        take(keys=[keys.worker_taken(node), INTERACTIVE], args=[1])
    returned = return_dead_feeders(private_redis, lambda node: node == "alive")
    assert returned == {"dead": 1}
    assert [message_job_id(m) for m in private_redis.lrange(INTERACTIVE, 0, -1)] == ["x2"]
    assert private_redis.llen(keys.worker_taken("alive")) == 1
    assert private_redis.smembers(keys.FEEDERS) == {"alive"}


def test_feeder_runs_each_job_once_within_its_slots_and_clears_what_ended(
    private_redis: redis.Redis,
) -> None:
    """A real feeder thread over a real Redis, with a run_job that records and waits: never more
    than ``slots`` jobs at once, every job once, and nothing left taken when they end."""
    fresh(private_redis, "f")
    ran: list[str] = []
    running = 0
    most = 0
    lock = threading.Lock()

    def run_job(job_id: str, claim: object) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
            ran.append(job_id)

    port = private_redis.connection_pool.connection_kwargs["port"]

    def blocking() -> redis.Redis:
        return redis.Redis(port=port, decode_responses=True, socket_timeout=5)

    feeder = JobFeeder(
        private_redis, "f", [INTERACTIVE, BATCH], 3, run_job, blocking, lambda n: True, 60
    )
    feeder.start()
    for index in range(10):
        private_redis.lpush(INTERACTIVE if index % 2 else BATCH, message(f"j{index}"))
    wait_for(lambda: len(ran) == 10, 20, "every job to run")
    feeder.stop_taking()
    assert feeder.join(10)
    assert sorted(ran) == sorted(f"j{index}" for index in range(10))
    assert most <= 3
    assert private_redis.llen(keys.worker_taken("f")) == 0


def test_a_restarted_node_puts_back_and_runs_what_its_previous_life_took(
    private_redis: redis.Redis,
) -> None:
    fresh(private_redis, "again")
    private_redis.rpush(keys.worker_taken("again"), f"{INTERACTIVE}\n{message('left-over')}")
    ran: list[str] = []
    port = private_redis.connection_pool.connection_kwargs["port"]
    feeder = JobFeeder(
        private_redis,
        "again",
        [INTERACTIVE],
        2,
        lambda job_id, claim: ran.append(job_id),
        lambda: redis.Redis(port=port, decode_responses=True, socket_timeout=5),
        lambda node: True,
        60,
    )
    feeder.start()
    wait_for(lambda: ran == ["left-over"], 10, "the previous life's job to run")
    feeder.stop_taking()
    assert feeder.join(10)
    assert private_redis.llen(keys.worker_taken("again")) == 0
    assert private_redis.sismember(keys.FEEDERS, "again")


def test_a_take_is_claimed_in_one_call_and_each_job_gets_its_claim(
    private_redis: redis.Redis,
) -> None:
    fresh(private_redis, "c")
    calls: list[list[str]] = []
    given: dict[str, object] = {}

    def claim_many(job_ids: list[str]) -> list[str]:
        calls.append(list(job_ids))
        return [f"claim-of-{job_id}" for job_id in job_ids]

    def run_job(job_id: str, claim: object) -> None:
        given[job_id] = claim

    for job in ("c1", "c2", "c3"):
        private_redis.lpush(INTERACTIVE, message(job))
    port = private_redis.connection_pool.connection_kwargs["port"]
    feeder = JobFeeder(
        private_redis,
        "c",
        [INTERACTIVE],
        8,
        run_job,
        lambda: redis.Redis(port=port, decode_responses=True, socket_timeout=5),
        lambda node: True,
        60,
        claim_many,
    )
    feeder.start()
    wait_for(lambda: len(given) == 3, 10, "the three jobs to run")
    feeder.stop_taking()
    assert feeder.join(10)
    assert calls == [["c1", "c2", "c3"]]  # one take, one claim call
    assert given == {job: f"claim-of-{job}" for job in ("c1", "c2", "c3")}
