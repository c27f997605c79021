"""The Celery worker entry point: ``celery -A worker.app worker``.

The app is built on first access (module ``__getattr__``), not at import, so settings are read
once from the file and environment when the worker starts. The model is loaded once per process
in ``worker_init``, before the worker consumes anything. On a plain Redis broker (the default)
generation jobs do not come through Celery's consumer but through a ``JobFeeder``
(worker/job_feeder.py), which takes every waiting job it has room for at once; on RabbitMQ, batch
jobs come through a ``BatchFeeder`` (worker/batch_feeder.py). Either is started once the worker
is ready and stopped with it; Celery keeps the rest (webhooks).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import redis
from celery import Celery, signals

from worker import keys
from worker.amqp_queues import consume_interactive_only, declare_queues, is_amqp
from worker.batch_feeder import BatchFeeder
from worker.capacity import PRIORITY_STEPS, node_alive
from worker.config import Settings, load_settings
from worker.job_feeder import BLOCK_SECONDS as FEEDER_BLOCK_SECONDS
from worker.job_feeder import JobFeeder
from worker.queueing import direct_feed, enqueue_generation, enqueue_webhook, make_celery
from worker.redis_connection import client_options
from worker.runtime import WorkerRuntime
from worker.tasks import current_runtime, install_runtime, register_tasks
from worker.tracing import Tracing

_app: Celery | None = None
_feeder: BatchFeeder | JobFeeder | None = None


def create_worker_app() -> Celery:
    settings = load_settings(environ=os.environ)
    if settings.worker.gil_switch_interval_ms > 0:
        sys.setswitchinterval(settings.worker.gil_switch_interval_ms / 1000.0)
    served = settings.served_models()
    app = make_celery(settings, served)
    app.conf.worker_pool = "threads"
    # Enough task threads to fill every engine thread's batch for every served model.
    app.conf.worker_concurrency = sum(
        settings.model(name).max_batch_size * settings.model(name).inter_threads for name in served
    )
    register_tasks(app, settings.webhooks)
    amqp = is_amqp(settings.broker_url)
    direct = direct_feed(settings)
    if amqp:
        consume_interactive_only(app, served)
    elif direct:  # generation tasks come through the JobFeeder; Celery keeps the webhooks
        app.amqp.queues.select([keys.WEBHOOK_QUEUE])
    # Requeued jobs may belong to any model, not only those this worker consumes.
    producer = make_celery(settings, settings.models)

    def requeue(job_id: str, model: str, priority: int) -> None:
        enqueue_generation(producer, job_id, model, priority)

    def notify(job_id: str) -> None:
        enqueue_webhook(producer, job_id)

    @signals.worker_init.connect(weak=False)
    def load_models(sender: Any = None, **_: Any) -> None:
        logging.basicConfig(level=logging.INFO)
        # Celery's "received" and "succeeded" lines repeat the job log's "claimed" and
        # "finished" (trickle.jobs); formatting and writing them was 5% of the worker's CPU on
        # short jobs. Task failures still come through at ERROR.
        for name in ("celery.worker.strategy", "celery.app.trace"):
            logging.getLogger(name).setLevel(logging.WARNING)
        if amqp:
            declare_queues(app)
        node = getattr(sender, "hostname", "worker")
        tracing = Tracing.from_environment(os.environ, "trickle-worker")
        runtime = WorkerRuntime(settings, requeue, node_name=node, notify=notify, tracing=tracing)
        install_runtime(runtime)

    @signals.worker_ready.connect(weak=False)
    def announce(**_: Any) -> None:
        global _feeder
        runtime = current_runtime()
        runtime.start()
        if amqp:
            _feeder = batch_feeder(app, settings, runtime)
            _feeder.start()
        elif direct:
            _feeder = job_feeder(settings, runtime, app.conf.worker_concurrency)
            _feeder.start()

    @signals.worker_shutting_down.connect(weak=False)
    def hand_back(**_: Any) -> None:
        if _feeder is not None:
            _feeder.stop_taking()
        handed = current_runtime().hand_back_pending()
        logging.getLogger(__name__).info("warm shutdown: %d waiting job(s) handed back", handed)

    @signals.worker_shutdown.connect(weak=False)
    def shutdown(**_: Any) -> None:
        if _feeder is not None:  # its running batch jobs end (and are acked) first
            _feeder.join(settings.limits.max_job_seconds)
        runtime = current_runtime()
        runtime.close()
        runtime.tracing.shutdown()
        install_runtime(None)

    return app


def job_feeder(settings: Settings, runtime: WorkerRuntime, slots: int) -> JobFeeder:
    """Plain Redis broker: the feeder of this worker's models' queues, interactive lists first."""
    options = client_options(settings.redis)
    blocking = {**options, "socket_timeout": FEEDER_BLOCK_SECONDS + options["socket_timeout"]}
    steps = sorted(PRIORITY_STEPS)
    queues = [keys.model_queue_list(name, step) for step in steps for name in runtime.engines]
    ttl = settings.worker.heartbeat_ttl_seconds

    def alive(node: str) -> bool:
        return node_alive(runtime.redis, settings.models, node, ttl, time.time())

    return JobFeeder(
        redis.Redis.from_url(settings.broker_url, **options),
        runtime.node_name,
        queues,
        slots,
        runtime.run_job,
        lambda: redis.Redis.from_url(settings.broker_url, **blocking),
        alive,
        settings.worker.recovery_interval_seconds,
        runtime.claim_many,
    )


def batch_feeder(app: Celery, settings: Settings, runtime: WorkerRuntime) -> BatchFeeder:
    """RabbitMQ: the feeder of this worker's models' batch queues, gated by free slots."""
    return BatchFeeder(
        app.connection_for_read,
        {name: app.amqp.queues[keys.model_batch_queue(name)] for name in runtime.engines},
        runtime.batch_room,
        runtime.run_job,
        settings.broker.batch_poll_ms / 1000,
    )


def __getattr__(name: str) -> Celery:
    global _app
    if name != "app":
        raise AttributeError(name)
    if _app is None:
        _app = create_worker_app()
    return _app
