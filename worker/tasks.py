"""Celery task glue: load the per-process runtime and let it run the job."""

from __future__ import annotations

import logging

from celery import Celery

from worker import keys
from worker.config import WebhookSettings
from worker.runtime import WorkerRuntime
from worker.webhooks import WebhookFailed, WebhookRejected, deliver_job

log = logging.getLogger(__name__)
WEBHOOK_BACKOFF_CAP_SECONDS = 60

_runtime: WorkerRuntime | None = None


def install_runtime(runtime: WorkerRuntime | None) -> None:
    global _runtime
    _runtime = runtime


def current_runtime() -> WorkerRuntime:
    if _runtime is None:
        raise RuntimeError("worker runtime not initialised (worker_init signal did not run)")
    return _runtime


def register_tasks(app: Celery, webhooks: WebhookSettings) -> None:
    @app.task(name=keys.GENERATE_TASK, ignore_result=True)
    def generate(job_id: str) -> None:
        """Run one job; acked only after its result is stored (acks_late)."""
        current_runtime().run_job(job_id)

    # Celery's own exponential backoff: 1, 2, 4... s with full jitter, capped, then given up.
    @app.task(
        name=keys.WEBHOOK_TASK,
        ignore_result=True,
        autoretry_for=(WebhookFailed,),
        retry_backoff=1,
        retry_backoff_max=WEBHOOK_BACKOFF_CAP_SECONDS,
        retry_jitter=True,
        max_retries=max(webhooks.max_attempts - 1, 0),
    )
    def webhook(job_id: str) -> None:
        """Deliver a finished job to its webhook; a receiver that refuses it is not retried."""
        try:
            runtime = current_runtime()
            deliver_job(runtime.store, job_id, runtime.settings.webhooks)
        except WebhookRejected as exc:
            log.error("webhook for %s given up: %s", job_id, exc)  # retrying cannot help
