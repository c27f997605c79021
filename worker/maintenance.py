"""A worker's background duties: heartbeats, lease renewal, and sweeping up other workers' mess.

Every live worker sweeps: running jobs whose lease lapsed (their worker died) are requeued and
resume where their stream stopped (every recovery interval); queued jobs past their client's
deadline end ``expired`` (at the earliest deadline, which each tick reads: trickle/store/
deadlines.py), whether or not any worker serves their model; queued jobs past the queue TTL
fail with a clear error (checked at a tenth of the TTL, at most once a minute).
The sweep is idempotent and race-free (each transition is one Lua script), so any number of
workers may run it at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from trickle import capacity, keys
from trickle.config.settings import Settings
from trickle.joblog import log_job_event
from trickle.jobs import JobError
from trickle.store.deadlines import DEADLINE_SLACK_SECONDS, next_check_in, sweep_due
from trickle.store.job_store import JobStore
from trickle.store.leases import RecoveryOutcome
from trickle.telemetry.metric_defs import JOBS
from trickle.telemetry.metrics import MetricsRecorder
from trickle.waiting import WorkerOutlook
from trickle.waiting_reader import publish_outlook
from worker import reclaim
from worker.in_flight import InFlight

log = logging.getLogger(__name__)

TICK_SECONDS = 0.25
# The loop never spins: a duty due now still waits this long after the last one.
LEAST_WAIT_SECONDS = 0.005
METRICS_FLUSH_SECONDS = 2.0
# How often a worker's outlook (when its slots free) is refreshed while it runs jobs: the web
# tier tells waiters their expected start at least once a second.
OUTLOOK_SECONDS = 0.5
MAX_EXPIRY_INTERVAL_SECONDS = 60.0
LEASE_LOST = JobError("lease_lost", "this worker lost the job's lease; another worker runs it")


@dataclass
class WorkerDuties:
    """What the maintenance loop works on: this worker's identity, its jobs and its Redis."""

    settings: Settings
    node_name: str
    models: tuple[str, ...]  # the models this worker serves
    redis: redis.Redis
    store: JobStore
    metrics: MetricsRecorder
    in_flight: InFlight
    slot_usage: Callable[[], dict[str, tuple[int, int]]]
    requeue: Callable[[str], str]  # job id -> its model, after putting it back on its queue
    queue_depth: Callable[[str], int]  # model -> tasks waiting in its queue (the broker's)
    # A job whose lease this worker, alive, found lost: stop its copy, report the lapse.
    lease_lost: Callable[[str], None]
    # Called when Redis answers with another run_id: it restarted, and may have lost writes.
    redis_restarted: Callable[[], None] = lambda: None
    # Each served model's outlook now (worker/outlook.py), for the waiting estimate.
    outlooks: Callable[[], dict[str, WorkerOutlook]] = dict

    @property
    def lease_ms(self) -> int:
        return int(self.settings.worker.lease_seconds * 1000)


def expiry_interval(settings: Settings) -> float:
    """How often to look for queued jobs past their TTL: a tenth of the TTL (a day-long TTL is
    checked once a minute), never more often than the recovery sweep. Each pass reads every
    shard's queue index, so it is not free."""
    tenth = min(settings.limits.queued_ttl_seconds / 10, MAX_EXPIRY_INTERVAL_SECONDS)
    return max(settings.worker.recovery_interval_seconds, tenth)


class Maintenance:
    def __init__(self, duties: WorkerDuties):
        self._runtime = duties
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trickle-maintenance", daemon=True)
        # Renewal has a thread of its own: a slow sweep, expiry or republish (hundreds of jobs
        # after a Redis restart) must never make this worker's own leases lapse.
        self._renewer = threading.Thread(target=self._renew, name="trickle-leases", daemon=True)
        self._next: dict[str, float] = {}
        self._run_id = ""  # the Redis server's, as the last heartbeat found it
        self._outlook_busy, self._outlook_at = False, 0.0  # the last outlook written
        self._deadlines_swept_at = 0.0  # when (unix s) the shards' deadlines were last swept

    def start(self) -> None:
        try:
            dropped = reclaim.release_previous_life(self._runtime.store, self._runtime.node_name)
            if dropped:
                log.info("dropped %d lease(s) of this node's previous process", len(dropped))
            self.heartbeat()
        except redis.RedisError as exc:  # the loop retries the heartbeat; leases lapse anyway
            log.warning("start-up duties failed: %s", exc)
        self._thread.start()
        self._renewer.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._renewer):
            if thread.is_alive():
                thread.join(timeout=5)

    def _renew(self) -> None:
        while not self._stop.wait(self._runtime.settings.worker.lease_seconds / 3):
            try:
                self.renew_leases()
            except redis.RedisError as exc:
                log.warning("renew failed: %s", exc)
            except Exception:  # never end the thread: every lease would lapse unnoticed
                log.exception("renew failed")

    def withdraw(self) -> None:
        """Leave the per-model worker sets so /readyz stops counting this worker at once."""
        runtime = self._runtime
        try:
            for name in runtime.models:
                runtime.redis.zrem(keys.model_workers(name), runtime.node_name)
            runtime.redis.delete(keys.worker_slots_key(runtime.node_name))
        except redis.RedisError:
            log.warning("could not withdraw heartbeat for %s", runtime.node_name)

    def _run(self) -> None:
        worker = self._runtime.settings.worker
        # A duty may name its next turn sooner than its interval (the deadline sweep: the next
        # deadline); the loop wakes for the earliest turn due, at least every tick.
        duties: tuple[tuple[str, float, Callable[[], float | None]], ...] = (
            ("heartbeat", worker.heartbeat_seconds, self.heartbeat),
            ("sweep", worker.recovery_interval_seconds, self.sweep),
            ("deadlines", TICK_SECONDS, self.expire_at_deadlines),
            ("expire", expiry_interval(self._runtime.settings), self.expire),
            ("republish", worker.republish_after_seconds / 2, self.republish),
            ("metrics", METRICS_FLUSH_SECONDS, self.flush_metrics),
            ("outlook", OUTLOOK_SECONDS, self.publish_outlook),
        )
        while not self._stop.wait(self._pause()):
            now = time.monotonic()
            for name, interval, duty in duties:
                if now < self._next.get(name, 0.0):
                    continue
                self._next[name] = now + interval
                try:
                    sooner = duty()
                except redis.RedisError as exc:
                    log.warning("%s failed: %s", name, exc)
                    continue
                except Exception:  # a bug in one duty must not stop the others (heartbeats)
                    log.exception("%s failed", name)
                    continue
                if sooner is not None:
                    self._next[name] = time.monotonic() + min(sooner, interval)

    def _pause(self) -> float:
        """Until the earliest duty's turn, at most a tick (at least a few milliseconds)."""
        now = time.monotonic()
        earliest = min(self._next.values(), default=now + TICK_SECONDS)
        return min(TICK_SECONDS, max(earliest - now, LEAST_WAIT_SECONDS))

    def flush_metrics(self) -> None:
        self._runtime.metrics.flush(self._runtime.redis)

    def heartbeat(self) -> None:
        runtime = self._runtime
        now = time.time()
        stale = now - runtime.settings.worker.heartbeat_ttl_seconds
        pipe = runtime.redis.pipeline(transaction=False)
        for name in runtime.models:
            pipe.zadd(keys.model_workers(name), {runtime.node_name: now})
            pipe.zremrangebyscore(keys.model_workers(name), "-inf", stale)
        ttl = runtime.settings.worker.heartbeat_ttl_seconds
        usage, idle_since = runtime.slot_usage(), runtime.in_flight.idle_since()
        capacity.publish_slots(pipe, runtime.node_name, usage, idle_since, ttl)
        if runtime.store.cluster:  # a cluster's nodes each have their own run_id
            pipe.execute()
            return
        pipe.info("server")
        *written, info = pipe.execute(raise_on_error=False)
        for reply in written:
            if isinstance(reply, Exception):
                raise reply
        if not isinstance(info, dict):  # INFO refused (an ACL): no restarts noticed, no noise
            return
        run_id = str(info.get("run_id", ""))
        if self._run_id and run_id != self._run_id:
            log.warning("Redis restarted (run_id %s, was %s)", run_id, self._run_id)
            runtime.redis_restarted()
        self._run_id = run_id

    def publish_outlook(self) -> None:
        """This worker's outlook per model, for the waiting estimate: while it runs jobs at
        every turn, idle only once per heartbeat (what it says changes only with jobs)."""
        runtime = self._runtime
        busy = bool(runtime.in_flight.running_models())
        now = time.time()
        worker = runtime.settings.worker
        fresh = now - self._outlook_at < worker.heartbeat_seconds
        if not busy and not self._outlook_busy and fresh:
            return
        pipe = runtime.redis.pipeline(transaction=False)
        publish_outlook(pipe, runtime.node_name, runtime.outlooks(), worker.heartbeat_ttl_seconds)
        pipe.execute()
        self._outlook_busy, self._outlook_at = busy, now

    def renew_leases(self) -> None:
        runtime = self._runtime
        for job_id in runtime.store.leases.renew(runtime.in_flight.leases(), runtime.lease_ms):
            runtime.lease_lost(job_id)

    def sweep(self) -> None:
        runtime = self._runtime
        now = time.time()
        for job_id, outcome in runtime.store.leases.recover_orphans(now).items():
            if outcome is RecoveryOutcome.REQUEUED:
                model = runtime.requeue(job_id)
            else:
                model = runtime.store.model_of(job_id)
            log_job_event(
                "worker_lost", job_id, model, outcome=outcome.value, swept_by=runtime.node_name
            )
            if outcome is RecoveryOutcome.CANCELED:
                runtime.metrics.count(JOBS, model=model, status="canceled")

    def republish(self) -> None:
        """Publish again the task of a job whose record outlived it: still queued long after
        its submission, while its model's queue is empty (nothing is waiting that could be its
        task). The record is written before its task is published; a web process that died in
        between leaves exactly this."""
        runtime = self._runtime
        after = runtime.settings.worker.republish_after_seconds
        stale = runtime.store.queued_before(time.time() - after)
        if not stale:
            return
        empty: dict[str, bool] = {}
        for job_id in stale:
            model = runtime.store.model_of(job_id)
            if model not in runtime.settings.models:
                continue
            if model not in empty:
                empty[model] = runtime.queue_depth(model) == 0
            if empty[model] and runtime.store.claim_republish(job_id, after):
                runtime.requeue(job_id)
                log_job_event("republished", job_id, model, by=runtime.node_name)

    def expire(self) -> None:
        runtime = self._runtime
        for job_id in runtime.store.expire_queued(time.time()):
            model = runtime.store.model_of(job_id)
            log_job_event("expired_in_queue", job_id, model)
            runtime.metrics.count(JOBS, model=model, status="failed")

    def expire_at_deadlines(self) -> float:
        """End the queued jobs that no worker started by their client's deadline (any model's:
        a model nobody serves is the case that needs it). Each turn reads the earliest deadline
        (one command) and, when it came, expires the due entries of that index (and every
        shard each recovery interval regardless); returns the seconds until the next turn: the
        next deadline, so a job ends within a few milliseconds of it, a tick at most."""
        runtime = self._runtime
        deadlines = runtime.store.deadlines
        now, soonest = time.time(), deadlines.soonest()
        most = runtime.settings.worker.recovery_interval_seconds
        ended: list[str] | None = None
        if sweep_due(now, self._deadlines_swept_at, most):
            self._deadlines_swept_at = now  # every shard: an entry lost from deadlines_next
            ended = deadlines.expire_due(now)
        elif soonest is not None and soonest <= now:
            ended = deadlines.expire_next(now)  # only the due entries
        if ended is not None:
            for job_id in ended:
                model = runtime.store.model_of(job_id)
                log_job_event("expired", job_id, model, swept_by=runtime.node_name)
                runtime.metrics.count(JOBS, model=model, status="expired")
            now, soonest = time.time(), deadlines.soonest()
        delay = next_check_in(now, soonest, self._deadlines_swept_at, TICK_SECONDS)
        return delay + DEADLINE_SLACK_SECONDS
