"""How loaded each model is: queue depth over every priority, oldest waiting job, worker slots.

One reading serves the /metrics gauges, the queue bound (429), the KEDA endpoint and the
autoscaler, so they can never disagree. The queue's side comes from a ``QueueMeter`` (in
service ``trickle.queue.QueueReader``: the broker's own count, through Celery); the workers'
side from their heartbeats. Part of the contract: no engine import, the web tier uses it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from trickle import keys
from trickle.config.sections import ModelSettings

IDLE_SINCE_FIELD = "idle_since"


class QueueMeter(Protocol):
    """What a load reading needs of a model's queue: ``trickle.queue.QueueReader`` (the
    broker's count), or a test's fake."""

    def depth(self, model: str) -> int: ...

    def oldest_queued_seconds(self, model: str, now: float) -> float: ...

    def batch_depth(self, model: str) -> int: ...


def slots_per_worker(model: ModelSettings) -> int:
    """Jobs one worker runs at once for a model: every engine lane's full batch (the reserve
    lane's, with two keys or more, are not capacity: no key may fill them)."""
    return model.max_batch_size * model.lanes


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
    # Of ``depth``, the batch-priority jobs (read only for the autoscaler's batch cap).
    batch_depth: int = 0

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

    def workers_needed(self, slots_per_worker: int, max_batch_workers: int | None = None) -> int:
        """Workers for the whole demand; with ``max_batch_workers``, waiting batch jobs alone
        want no more than that many (0: batch runs on what the rest leaves)."""
        per_worker = max(slots_per_worker, 1)
        everything = math.ceil(self.demand / per_worker)
        if max_batch_workers is None:
            return everything
        without_batch = math.ceil((self.demand - self.batch_depth) / per_worker)
        return max(without_batch, min(everything, max_batch_workers))


def live_workers(client: redis.Redis, model: str, heartbeat_ttl: float, now: float) -> int:
    """Workers serving ``model`` whose heartbeat is younger than ``heartbeat_ttl``."""
    return int(client.zcount(keys.model_workers(model), now - heartbeat_ttl, "+inf"))


def read_load(
    client: redis.Redis,
    model: str,
    heartbeat_ttl: float,
    now: float,
    queues: QueueMeter,
    batch: bool = False,
) -> ModelLoad:
    """The model's queue depth, oldest queued job age and live workers' slots; ``batch``: and
    how many of the waiting jobs are batch ones."""
    return ModelLoad(
        model=model,
        depth=queues.depth(model),
        oldest_queued_seconds=queues.oldest_queued_seconds(model, now),
        workers=live_worker_slots(client, model, now - heartbeat_ttl),
        batch_depth=queues.batch_depth(model) if batch else 0,
    )


def live_worker_slots(client: redis.Redis, model: str, fresh_since: float) -> list[WorkerSlots]:
    """Slots of every worker that heartbeated for the model since ``fresh_since``."""
    nodes = [str(n) for n in client.zrangebyscore(keys.model_workers(model), fresh_since, "+inf")]
    if not nodes:
        return []
    pipe = client.pipeline(transaction=False)
    for node in nodes:
        pipe.hmget(keys.worker_slots_key(node), [model, IDLE_SINCE_FIELD])
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
    name = keys.worker_slots_key(node)
    fields: dict[Any, Any] = {model: f"{busy}/{total}" for model, (busy, total) in slots.items()}
    fields[IDLE_SINCE_FIELD] = repr(idle_since)
    pipe.hset(name, mapping=fields)
    pipe.pexpire(name, max(int(ttl * 1000), 1))
