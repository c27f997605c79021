"""`trickle up --workers MIN:MAX`: worker processes follow the queues, down to zero when idle.

Every ``interval_seconds`` it reads, per served model, the queue depth (every priority), the
oldest queued job's age and the live workers' busy and total slots (``trickle.capacity``), then:

- wants ``ceil((queued + running) / slots per worker)`` workers for the neediest model (with
  ``[autoscale] max_batch_workers``, waiting batch jobs alone want at most that many; 0: batch
  runs only on capacity interactive work leaves), plus
  one more when jobs have waited ``scale_up_after_seconds`` with every live slot busy and no
  worker is already starting, clamped to MIN..MAX;
- starts the missing ones at once (a job submitted to zero workers waits for the first);
- stops a worker only after it had no job for ``idle_seconds``, and never below MIN or what
  the queues need. Stopping is Celery's warm shutdown: its waiting jobs go back to the queue.

The same decision is what ``GET /scaling/<model>`` hands to KEDA on a cluster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import kombu.exceptions
import redis

from ops.supervisor import Child, Supervisor
from trickle import keys
from trickle.capacity import ModelLoad, QueueMeter, read_load, slots_per_worker
from trickle.config.settings import Settings

MARKER_TTL_MS = 10_000
UNMATCHED_WARNING_SECONDS = 120.0


@dataclass(frozen=True)
class WorkerRange:
    min: int
    max: int

    @classmethod
    def parse(cls, text: str) -> WorkerRange:
        """``MIN:MAX`` (or ``N`` for a fixed N); ValueError naming the expected form."""
        low, sep, high = text.strip().partition(":")
        try:
            bounds = cls(int(low), int(high if sep else low))
        except ValueError:
            raise ValueError(f"--workers/TRICKLE_WORKERS must be MIN:MAX, got {text!r}") from None
        if bounds.min < 0 or bounds.max < max(bounds.min, 1):
            raise ValueError(f"--workers needs 0 <= MIN <= MAX and MAX >= 1, got {text!r}")
        return bounds


def desired_workers(
    loads: Sequence[tuple[ModelLoad, int]],
    bounds: WorkerRange,
    live: int,
    starting: int,
    scale_up_after_seconds: float,
    max_batch_workers: int | None = None,
) -> int:
    """Workers wanted now: the neediest model's slot demand, plus one if jobs age unserved;
    waiting batch jobs alone never want more than ``max_batch_workers`` (None: no cap)."""
    want = bounds.min
    for load, per_worker in loads:
        want = max(want, load.workers_needed(per_worker, max_batch_workers))
        saturated = load.busy >= load.total
        batch_may_grow = max_batch_workers is None or live < max_batch_workers
        if (
            (load.depth - load.batch_depth > 0 or (load.depth > 0 and batch_may_grow))
            and saturated
            and starting == 0
            and load.oldest_queued_seconds >= scale_up_after_seconds
        ):
            want = max(want, live + 1)
    return min(max(want, bounds.min), bounds.max)


def node_port(node: str) -> int | None:
    """The $PORT in a Procfile worker's node name (``worker-5100@host``), which names its child."""
    name = node.split("@", 1)[0]
    _, _, port = name.rpartition("-")
    return int(port) if port.isdigit() else None


class Autoscaler:
    def __init__(
        self,
        supervisor: Supervisor,
        spawn: Callable[[], Child],
        settings: Settings,
        bounds: WorkerRange,
        client: redis.Redis,
        queues: QueueMeter,
        kind: str = "worker",
    ) -> None:
        self.supervisor = supervisor
        self.spawn = spawn
        self.settings = settings
        self.bounds = bounds
        self.client = client
        self.queues = queues  # the broker's count of waiting jobs (trickle.queue)
        self.kind = kind
        self.models = settings.served_models()
        self._next = 0.0
        self._last_want: int | None = None
        self._redis_down = False
        self._unmatched: set[str] = set()

    def tick(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.settings.autoscale.interval_seconds
        try:
            self._scale()
            self._redis_down = False
        except (redis.RedisError, kombu.exceptions.OperationalError) as exc:
            # Redis restarting (the supervisor handles that) or the broker away: hold.
            if not self._redis_down:
                self.supervisor.log(f"autoscaler: queues unavailable ({exc}); holding")
            self._redis_down = True

    def _scale(self) -> None:
        ttl = self.settings.worker.heartbeat_ttl_seconds
        max_batch_workers = self.settings.autoscale.max_batch_workers
        capped = max_batch_workers is not None
        loads = [
            (
                read_load(self.client, m, ttl, time.time(), self.queues, batch=capped),
                slots_per_worker(self.settings.model(m)),
            )
            for m in self.models
        ]
        # Per worker (by its $PORT): since when it has run no job, 0 while it runs one.
        idle_since: dict[int, float] = {}
        for load, _ in loads:
            for slots in load.workers:
                port = node_port(slots.node)
                if port is not None:
                    idle_since[port] = slots.idle_since
        pool = [
            c for c in self.supervisor.children.values() if c.kind == self.kind and not c.retiring
        ]
        up = [c for c in pool if c.port in idle_since and c.alive]
        starting = len([c for c in pool if c not in up and not c.given_up])
        self._warn_unmatched([c for c in pool if c not in up and c.alive])
        want = desired_workers(
            loads,
            self.bounds,
            len(up),
            starting,
            self.settings.autoscale.scale_up_after_seconds,
            max_batch_workers,
        )
        self._mark(len(up))
        if want != self._last_want:
            self._last_want = want
            summary = "; ".join(
                f"{load.model}: {load.depth} queued, oldest {load.oldest_queued_seconds:.1f} s, "
                f"{load.busy}/{load.total} slots busy"
                for load, _ in loads
            )
            self.supervisor.log(f"autoscaler: want {want} worker(s), have {len(pool)} ({summary})")
        for _ in range(want - len(pool)):
            self.spawn()
        surplus = len(pool) - max(want, self.bounds.min)
        idle_for = self.settings.autoscale.idle_seconds
        wall = time.time()
        idle = sorted(
            (c for c in up if 0 < idle_since[c.port] <= wall - idle_for),
            key=lambda c: idle_since[c.port],
        )
        for child in idle[: max(surplus, 0)]:
            self.supervisor.log(f"autoscaler: {child.name} idle for {idle_for:g} s, stopping it")
            # A job claimed since its last heartbeat runs to the end (warm shutdown).
            self.supervisor.retire(child.name, self.settings.limits.max_job_seconds + 10)

    def _warn_unmatched(self, children: list[Child]) -> None:
        """A worker alive for long without a heartbeat we can match is a naming problem."""
        for child in children:
            if time.monotonic() - child.started_at > UNMATCHED_WARNING_SECONDS:
                if child.name not in self._unmatched:
                    self.supervisor.log(
                        f"autoscaler: no heartbeat from {child.name} matches its $PORT "
                        f"{child.port}; keep -$PORT@ in the Procfile's --hostname"
                    )
                self._unmatched.add(child.name)

    def _mark(self, workers: int) -> None:
        """Tell /readyz that zero workers is fine: this autoscaler starts one on demand."""
        marker = {"min": self.bounds.min, "max": self.bounds.max, "workers": workers}
        self.client.set(keys.AUTOSCALER, json.dumps(marker), px=MARKER_TTL_MS)
