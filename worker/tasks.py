"""Celery task glue: load the per-process runtime and let it run the job."""

from __future__ import annotations

from celery import Celery

from worker import keys
from worker.runtime import WorkerRuntime

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
