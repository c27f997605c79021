"""Celery task glue: load the per-process runtime and let it run the job."""

from __future__ import annotations

import logging

from celery import Celery, Task

from worker import keys
from worker.runtime import WorkerRuntime
from worker.webhooks import WebhookFailed, WebhookRejected

log = logging.getLogger(__name__)

_runtime: WorkerRuntime | None = None


def install_runtime(runtime: WorkerRuntime | None) -> None:
    global _runtime
    _runtime = runtime


def current_runtime() -> WorkerRuntime:
    if _runtime is None:
        raise RuntimeError("worker runtime not initialised (worker_init signal did not run)")
    return _runtime


def register_tasks(app: Celery) -> None:
    @app.task(name=keys.GENERATE_TASK, ignore_result=True)
    def generate(job_id: str) -> None:
        """Run one job; acked only after its result is stored (acks_late)."""
        current_runtime().run_job(job_id)

    @app.task(name=keys.WEBHOOK_TASK, ignore_result=True, bind=True, max_retries=None)
    def webhook(task: Task, job_id: str) -> None:
        """Deliver a finished job to its webhook, retrying with backoff (1, 2, 4... s)."""
        runtime = current_runtime()
        settings = runtime.settings.webhooks
        try:
            runtime.deliver_webhook(job_id)
        except WebhookRejected as exc:
            log.error("webhook for %s given up: %s", job_id, exc)  # retrying cannot help
        except WebhookFailed as exc:
            if task.request.retries + 1 >= settings.max_attempts:
                log.error(
                    "webhook for %s given up after %d attempts: %s",
                    job_id,
                    settings.max_attempts,
                    exc,
                )
                return
            raise task.retry(exc=exc, countdown=2**task.request.retries) from exc
