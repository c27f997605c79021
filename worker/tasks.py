"""The Celery tasks: generation (run by worker/dispatch.py's strategy) and webhook delivery.

Both reach the worker's runtime through the app's ``TrickleWorker`` bootstep (``app.trickle``),
which builds it once per process; there is no module-level state here.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from celery import Celery

from trickle import keys
from trickle.config.sections import WebhookSettings
from trickle.config.settings import Settings
from trickle.store.job_store import JobStore
from trickle.webhooks import WebhookFailed, WebhookRejected, deliver_job

log = logging.getLogger(__name__)
WEBHOOK_BACKOFF_CAP_SECONDS = 60
GENERATE_STRATEGY = "worker.dispatch:generate_strategy"


class TaskRuntime(Protocol):
    """What the tasks use of the worker's runtime (``worker.runtime.WorkerRuntime``)."""

    store: JobStore
    settings: Settings

    def run_job(self, job_id: str) -> None: ...


def runtime_of(app: Any) -> TaskRuntime:
    runtime: TaskRuntime | None = getattr(getattr(app, "trickle", None), "runtime", None)
    if runtime is None:
        raise RuntimeError("worker runtime not running (the TrickleWorker bootstep did not start)")
    return runtime


def register_tasks(app: Celery, webhooks: WebhookSettings) -> None:
    # The strategy hands each request to the dispatcher (claim many at once, ack after the
    # result is stored); the body runs only if something calls the task directly.
    @app.task(name=keys.GENERATE_TASK, ignore_result=True, bind=True, Strategy=GENERATE_STRATEGY)
    def generate(self: Any, job_id: str) -> None:
        """Run one job; returns once its final state is stored."""
        runtime_of(self.app).run_job(job_id)

    # Celery's own exponential backoff: 1, 2, 4... s with full jitter, capped, then given up.
    @app.task(
        name=keys.WEBHOOK_TASK,
        ignore_result=True,
        bind=True,
        autoretry_for=(WebhookFailed,),
        retry_backoff=1,
        retry_backoff_max=WEBHOOK_BACKOFF_CAP_SECONDS,
        retry_jitter=True,
        max_retries=max(webhooks.max_attempts - 1, 0),
    )
    def webhook(self: Any, job_id: str) -> None:
        """Deliver a finished job to its webhook; a receiver that refuses it is not retried."""
        try:
            runtime = runtime_of(self.app)
            deliver_job(runtime.store, job_id, runtime.settings.webhooks)
        except WebhookRejected as exc:
            log.error("webhook for %s given up: %s", job_id, exc)  # retrying cannot help
