"""How loaded each model is: queue depth over every priority, oldest waiting job, worker slots.

One reading serves the /metrics gauges, the queue bound (429), the KEDA endpoint and the
autoscaler, so they can never disagree. kombu keeps each priority step of a queue in its own
Redis list, so counting only the bare queue name (``LLEN trickle.<model>``) would miss every
batch-priority job. Part of the contract: no engine import, the web tier uses it.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from worker import keys
from worker.config import ModelSettings
from worker.jobs import BATCH_PRIORITY, INTERACTIVE_PRIORITY

# The priority steps kombu's Redis transport keeps apart (one list each); a job's priority is
# one of them.
PRIORITY_STEPS = (INTERACTIVE_PRIORITY, BATCH_PRIORITY)
PRIORITIES = PRIORITY_STEPS
IDLE_SINCE_FIELD = "idle_since"


class QueueReader(Protocol):
    """Where a model's waiting jobs are counted: Redis lists here, RabbitMQ in amqp_queues."""

    def depth(self, model: str) -> int: ...

    def oldest_queued_seconds(self, model: str, now: float) -> float: ...


class RedisQueueReader:
    """The Redis transport's queues, read straight from kombu's lists. ``jobs``: the job-state
    Redis when the queue has one of its own (the job state on a cluster, say)."""

    def __init__(self, client: redis.Redis, jobs: Any = None):
        self._redis = client
        self._jobs = jobs

    def depth(self, model: str) -> int:
        return queue_depth(self._redis, model)

    def oldest_queued_seconds(self, model: str, now: float) -> float:
        return oldest_queued_seconds(self._redis, model, now, self._jobs)


def slots_per_worker(model: ModelSettings) -> int:
    """Jobs one worker runs at once for a model: every engine thread's full batch."""
    return model.max_batch_size * model.inter_threads


def queue_lists(model: str) -> list[str]:
    """Every Redis list that holds a model's queued job ids, highest priority first."""
    return [keys.model_queue_list(model, priority) for priority in PRIORITIES]


def queue_depth(client: redis.Redis, model: str) -> int:
    """Jobs waiting for a worker in the model's queue, at every priority."""
    pipe = client.pipeline(transaction=False)
    for name in queue_lists(model):
        pipe.llen(name)
    return sum(int(n) for n in pipe.execute())


@dataclass(frozen=True)
class WorkerSlots:
    """One live worker's task slots for one model (busy: jobs it runs now)."""

    node: str
    busy: int
    total: int
    # Wall-clock time since which the worker has run no job at all (any model); 0 while busy.
    idle_since: float = 0.0


@dataclass(frozen=True)
class ModelLoad:
    """Everything a scaler needs about one model, read at one moment."""

    model: str
    depth: int
    oldest_queued_seconds: float
    workers: list[WorkerSlots] = field(default_factory=list)

    @property
    def busy(self) -> int:
        return sum(w.busy for w in self.workers)

    @property
    def total(self) -> int:
        return sum(w.total for w in self.workers)

    @property
    def demand(self) -> int:
        """Slots this model needs right now: its running jobs plus its waiting ones."""
        return self.depth + self.busy

    def workers_needed(self, slots_per_worker: int) -> int:
        return math.ceil(self.demand / max(slots_per_worker, 1))


def live_workers(client: redis.Redis, model: str, heartbeat_ttl: float, now: float) -> int:
    """Workers serving ``model`` whose heartbeat is younger than ``heartbeat_ttl``."""
    return int(client.zcount(keys.model_workers(model), now - heartbeat_ttl, "+inf"))


def node_alive(
    client: redis.Redis, models: Iterable[str], node: str, heartbeat_ttl: float, now: float
) -> bool:
    """Whether worker ``node`` heartbeated for any of ``models`` within ``heartbeat_ttl``."""
    pipe = client.pipeline(transaction=False)
    for model in models:
        pipe.zscore(keys.model_workers(model), node)
    return any(score is not None and score >= now - heartbeat_ttl for score in pipe.execute())


def read_load(
    client: redis.Redis,
    model: str,
    heartbeat_ttl: float,
    now: float,
    queues: QueueReader | None = None,
) -> ModelLoad:
    """The model's queue depth, oldest queued job age and live workers' slots (``queues``:
    where its jobs wait; the Redis transport's lists unless told otherwise)."""
    queues = queues or RedisQueueReader(client)
    return ModelLoad(
        model=model,
        depth=queues.depth(model),
        oldest_queued_seconds=queues.oldest_queued_seconds(model, now),
        workers=worker_slots(client, model, now - heartbeat_ttl),
    )


def oldest_queued_seconds(client: redis.Redis, model: str, now: float, jobs: Any = None) -> float:
    """Age of the oldest job waiting in the model's queue (since submission); 0 when empty.
    ``jobs``: where the job hashes are, when not beside the queue.

    kombu pushes on the left and pops on the right, so each list's oldest message is its last.
    """
    oldest: float | None = None
    for name in queue_lists(model):
        job_id = message_job_id(client.lindex(name, -1))
        if job_id is None:
            continue
        created = (jobs or client).hget(keys.job(job_id), "created_at")
        if created is not None:
            oldest = min(oldest if oldest is not None else now, float(created))
    return max(now - oldest, 0.0) if oldest is not None else 0.0


def worker_slots(client: redis.Redis, model: str, fresh_since: float) -> list[WorkerSlots]:
    """Slots of every worker that heartbeated for the model since ``fresh_since``."""
    nodes = [str(n) for n in client.zrangebyscore(keys.model_workers(model), fresh_since, "+inf")]
    if not nodes:
        return []
    pipe = client.pipeline(transaction=False)
    for node in nodes:
        pipe.hmget(keys.worker_slots(node), [model, IDLE_SINCE_FIELD])
    slots = []
    for node, (value, idle_since) in zip(nodes, pipe.execute(), strict=True):
        busy, _, total = str(value or "0/0").partition("/")
        slots.append(WorkerSlots(node, int(busy or 0), int(total or 0), float(idle_since or 0)))
    return slots


def publish_slots(
    pipe: redis.client.Pipeline,
    node: str,
    slots: Mapping[str, tuple[int, int]],
    idle_since: float,
    ttl: float,
) -> None:
    """Queue the write of one worker's (busy, total) slots per model onto a heartbeat pipeline."""
    name = keys.worker_slots(node)
    fields: dict[Any, Any] = {model: f"{busy}/{total}" for model, (busy, total) in slots.items()}
    fields[IDLE_SINCE_FIELD] = repr(idle_since)
    pipe.hset(name, mapping=fields)
    pipe.pexpire(name, max(int(ttl * 1000), 1))


def message_job_id(message: str | bytes | None) -> str | None:
    """The job id a Celery task message on a Redis list carries (its first argument), or None
    if unreadable: the queue-age reader and the worker's job feeder read messages with it."""
    if message is None:
        return None
    try:
        envelope = json.loads(message)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0])
    except (ValueError, KeyError, IndexError, TypeError):
        return None
