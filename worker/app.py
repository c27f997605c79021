"""The Celery worker entry point: ``celery -A worker.app worker``.

The app is built on first access (module ``__getattr__``), not at import, so settings are read
once from the file and environment when the worker starts. The model is loaded once per process
in ``worker_init``, before the worker consumes anything.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery, signals

from worker.config import load_settings
from worker.queueing import enqueue_generation, enqueue_webhook, make_celery
from worker.runtime import WorkerRuntime
from worker.tasks import current_runtime, install_runtime, register_tasks
from worker.tracing import Tracing

_app: Celery | None = None


def create_worker_app() -> Celery:
    settings = load_settings(environ=os.environ)
    served = settings.served_models()
    app = make_celery(settings, served)
    app.conf.worker_pool = "threads"
    # Enough task threads to fill every engine thread's batch for every served model.
    app.conf.worker_concurrency = sum(
        settings.model(name).max_batch_size * settings.model(name).inter_threads for name in served
    )
    register_tasks(app, settings.webhooks)
    # Requeued jobs may belong to any model, not only those this worker consumes.
    producer = make_celery(settings, settings.models)

    def requeue(job_id: str, model: str, priority: int) -> None:
        enqueue_generation(producer, job_id, model, priority)

    def notify(job_id: str) -> None:
        enqueue_webhook(producer, job_id)

    @signals.worker_init.connect(weak=False)
    def load_models(sender: Any = None, **_: Any) -> None:
        logging.basicConfig(level=logging.INFO)
        node = getattr(sender, "hostname", "worker")
        tracing = Tracing.from_environment(os.environ, "trickle-worker")
        runtime = WorkerRuntime(settings, requeue, node_name=node, notify=notify, tracing=tracing)
        install_runtime(runtime)

    @signals.worker_ready.connect(weak=False)
    def announce(**_: Any) -> None:
        current_runtime().start()

    @signals.worker_shutting_down.connect(weak=False)
    def hand_back(**_: Any) -> None:
        handed = current_runtime().hand_back_pending()
        logging.getLogger(__name__).info("warm shutdown: %d waiting job(s) handed back", handed)

    @signals.worker_shutdown.connect(weak=False)
    def shutdown(**_: Any) -> None:
        runtime = current_runtime()
        runtime.close()
        runtime.tracing.shutdown()
        install_runtime(None)

    return app


def __getattr__(name: str) -> Celery:
    global _app
    if name != "app":
        raise AttributeError(name)
    if _app is None:
        _app = create_worker_app()
    return _app
