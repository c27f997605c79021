"""The Celery worker entry point: ``celery -A worker.app worker``.

Celery's CLI finds the module's ``app``, built once at import by ``create_worker_app`` from
settings loaded once from the file and this process's environment, and passed down from there.
Only Celery's CLI imports this module: the launcher preloads what it imports, never the module
itself (ops/preload.py), so each forked worker builds its app from its own environment.
Celery's own consumer takes every generation task, on every broker; the ``TrickleWorker``
bootstep owns what a worker adds to Celery: the runtime (models loaded once per process, before
anything is consumed; heartbeats, leases and sweeps) and the dispatcher that
``trickle.generate``'s task strategy hands each request to (worker/dispatch.py). Celery's pool
keeps the webhooks. Nothing else here is module state.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from celery import Celery, bootsteps

from trickle.capacity import slots_per_worker
from trickle.config.settings import Settings, load_settings
from trickle.heap import freeze_startup_heap
from trickle.queue import (
    QueueReader,
    enqueue_generation,
    enqueue_webhook,
    make_celery,
    tenant_queues,
)
from trickle.store.job_store import JobStore
from trickle.store.redis_connection import connect
from trickle.telemetry.tracing import Tracing
from trickle.tenants import TenantTable
from worker.dispatch import JobDispatcher
from worker.fairness.key_caps import KeyCaps
from worker.fairness.token_shares import TokenShares
from worker.fairness.vtc import VirtualTokenCounter
from worker.runtime import WorkerRuntime
from worker.tasks import register_tasks

log = logging.getLogger(__name__)
SETTINGS_KEY = "trickle_settings"


class TrickleWorker(bootsteps.StartStopStep):  # type: ignore[misc]
    """The worker's own long-lived parts: the runtime and the job dispatcher.

    Created with the worker (models load before the consumer starts), started once the pool is
    up, stopped after the consumer: waiting jobs go back to the queue, running ones end first.
    Reachable as ``worker.trickle`` (the task strategy) and ``app.trickle`` (the tasks).
    """

    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any):
        super().__init__(worker, **kwargs)
        self.settings: Settings = worker.app.conf[SETTINGS_KEY]
        self.runtime: WorkerRuntime | None = None
        self.dispatcher: JobDispatcher | None = None
        worker.trickle = self
        worker.app.trickle = self  # the tasks' way to the runtime (worker/tasks.py)

    def create(self, worker: Any) -> None:
        settings = self.settings
        # Celery's "received" and "succeeded" lines repeat the job log's "claimed" and
        # "finished" (trickle.jobs); task failures still come through at ERROR.
        for name in ("celery.worker.strategy", "celery.app.trace"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # Requeued jobs may belong to any model, not only those this worker consumes.
        producer = make_celery(settings, settings.models)

        tenants = TenantTable(settings.tenants)

        def requeue(job_id: str, model: str, priority: int, tenant_digest: str) -> None:
            tenant = tenants.name_of_digest(tenant_digest)
            enqueue_generation(producer, job_id, model, priority, tenant=tenant)

        def notify(job_id: str) -> None:
            enqueue_webhook(producer, job_id)

        tracing = Tracing.from_environment(os.environ, "trickle-worker")
        queues = QueueReader(producer, JobStore(connect(settings.redis), 0, 0))
        runtime = WorkerRuntime(
            settings, requeue, worker.hostname, notify, tracing, queue_depth=queues.depth
        )
        self.runtime = runtime
        caps = None
        if any(key.max_running_jobs for key in settings.keys.values()):
            entry_seconds = settings.limits.max_job_seconds + settings.worker.lease_seconds
            caps = KeyCaps(runtime.redis, tenants, entry_seconds)
        lane_slots, reserve_slots = ordinary_and_reserve_slots(settings)
        shares = None
        if settings.shares_slots and settings.tuning.share_lag_tokens > 0:
            served = settings.served_models()
            own = tenant_queues(producer)

            def backlog(tenant: str) -> bool:
                try:
                    return any(
                        queues.depth(model, tenant) for model in served if own.has(model, tenant)
                    )
                except Exception:  # the broker away: wait for nobody
                    log.warning("key %s: queue depth unreadable", tenant, exc_info=True)
                    return False

            shares = TokenShares(
                VirtualTokenCounter(settings.tuning.share_lag_tokens, tenants.weight), backlog
            )
        self.dispatcher = JobDispatcher(
            runtime.run_job,
            runtime.claim_and_start,
            worker.concurrency,
            caps,
            key_slots=lane_slots if reserve_slots else 0,
            shares=shares,
        )

    def start(self, worker: Any) -> None:
        assert self.runtime is not None and self.dispatcher is not None
        self.dispatcher.start()
        self.runtime.start()
        freeze_startup_heap()  # the models are loaded: the rest is serving

    def stop(self, worker: Any) -> None:
        runtime, dispatcher = self.runtime, self.dispatcher
        if runtime is None or dispatcher is None:
            return
        self.runtime = None
        dispatcher.stop_taking()
        handed = runtime.hand_back_pending()
        log.info("warm shutdown: %d waiting job(s) handed back", handed)
        dispatcher.join(self.settings.limits.max_job_seconds)
        runtime.close()
        runtime.tracing.shutdown()

    terminate = stop

    def shutdown(self, worker: Any) -> None:
        self.stop(worker)


def ordinary_and_reserve_slots(settings: Settings) -> tuple[int, int]:
    """(lane slots, reserve slots) of one worker over the models it serves: jobs the ordinary
    lanes run at once, and those the reserve lanes add (worker/engine/fair_share.py), which no
    single key may take: with keys sharing the slots one key holds at most the lane slots
    here."""
    shared = settings.shares_slots
    models = [settings.model(name) for name in settings.served_models()]
    lanes = sum(slots_per_worker(model) for model in models)
    reserve = sum(  # overflow lanes take jobs the window already holds: no slots
        model.max_batch_size * model.engine_lanes(shared).reserve for model in models
    )
    return lanes, reserve


def create_worker_app(settings: Settings) -> Celery:
    """The worker's Celery app: the queues of the models ``settings`` serves, the tasks, and
    the ``TrickleWorker`` bootstep, which reads ``settings`` from the app."""
    if settings.tuning.gil_switch_interval_ms > 0:
        sys.setswitchinterval(settings.tuning.gil_switch_interval_ms / 1000.0)
    logging.basicConfig(level=logging.INFO)
    served = settings.served_models()
    app = make_celery(settings, served)
    app.conf[SETTINGS_KEY] = settings
    app.conf.worker_pool = "threads"
    app.conf.worker_consumer = "worker.dispatch:TrickleConsumer"
    # Celery lowers the prefetch window after a reconnect and raises it again as the tasks of
    # before are acked; those acks cannot reach the new connection (worker/dispatch.py, _ack).
    app.conf.worker_enable_prefetch_count_reduction = False
    # Slots to fill every engine thread's batch for every served model, and the reserve lanes'
    # (keys sharing the slots only): the job threads, and the prefetch window (one message per
    # slot, acked once its job is stored).
    app.conf.worker_concurrency = sum(ordinary_and_reserve_slots(settings))
    register_tasks(app, settings.webhooks)
    app.steps["worker"].add(TrickleWorker)
    return app


# What `celery -A worker.app` finds (see the module doc).
app = create_worker_app(load_settings(environ=os.environ))
