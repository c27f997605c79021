"""The Celery worker entry point: ``celery -A worker.app worker``.

The app is built on first access (module ``__getattr__``), not at import, so settings are read
once from the file and environment when the worker starts. The model is loaded once per process
in ``worker_init``, before the worker consumes anything. On RabbitMQ, batch jobs do not come
through Celery but through a ``BatchFeeder`` (worker/batch_feeder.py), started once the worker is
ready and stopped with it.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from celery import Celery, signals

from worker import keys
from worker.amqp_queues import consume_interactive_only, declare_queues, is_amqp
from worker.batch_feeder import BatchFeeder
from worker.config import Settings, load_settings
from worker.queueing import enqueue_generation, enqueue_webhook, make_celery
from worker.runtime import WorkerRuntime
from worker.tasks import current_runtime, install_runtime, register_tasks
from worker.tracing import Tracing

_app: Celery | None = None
_feeder: BatchFeeder | None = None


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
    if amqp:
        consume_interactive_only(app, served)
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
