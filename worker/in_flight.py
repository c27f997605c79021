"""The jobs a worker process is running right now, shared by its task threads and its
maintenance loop: which leases to renew, whom to stop, and whether the worker is idle."""

from __future__ import annotations

import threading
import time

from trickle.jobs import FinishReason, JobError
from worker.engine.scheduled import ScheduledJob
from worker.length_ratios import LengthRatios


class InFlight:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, ScheduledJob] = {}
        self._models: dict[str, str] = {}
        self._idle_since = time.time()
        self.lengths = LengthRatios()  # how much of max_tokens finished jobs used, per model
        # The latest claim whose fresh jobs were all added here (wall clock; the claim
        # thread's): the waiting outlook's word that a claimed job it does not list runs.
        self.claims_through = 0.0

    def claims_seen(self, claimed_at: float) -> None:
        """Every fresh job claimed up to ``claimed_at`` is added here: moves
        ``claims_through`` forward, never back (the claim thread and job threads both claim)."""
        with self._lock:
            self.claims_through = max(self.claims_through, claimed_at)

    def add(self, job: ScheduledJob, model: str) -> None:
        with self._lock:
            self._jobs[job.job_id] = job
            self._models[job.job_id] = model

    def remove(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.pop(job_id, None)
            model = self._models.pop(job_id, None)
            self._idle_since = time.time()
        if job is not None and model is not None:
            self.lengths.finished(model, job)

    def by_model(self) -> dict[str, list[ScheduledJob]]:
        """The running jobs of each model (the waiting estimate's outlook)."""
        with self._lock:
            found: dict[str, list[ScheduledJob]] = {}
            for job_id, job in self._jobs.items():
                found.setdefault(self._models[job_id], []).append(job)
            return found

    def leases(self) -> dict[str, str]:
        """job id -> the fence this worker holds its lease with (a job whose final state is
        stored holds none until it leaves here, and its renewal says so: Leases.renew)."""
        with self._lock:
            return {job_id: job.fence for job_id, job in self._jobs.items()}

    def fence_of(self, job_id: str) -> str | None:
        """The fence this worker holds a running job's lease with (None: not running here)."""
        with self._lock:
            scheduled = self._jobs.get(job_id)
        return None if scheduled is None else scheduled.fence

    def idle_since(self) -> float:
        """When this worker last ran a job (its start if none yet); 0 while it runs one."""
        with self._lock:
            return 0.0 if self._models else self._idle_since

    def running_models(self) -> list[str]:
        """The model of every running job (a model appears once per job)."""
        with self._lock:
            return list(self._models.values())

    def stop(self, job_id: str, reason: FinishReason, error: JobError | None) -> None:
        """Ask a running job to end at its next token (no-op for one not running here)."""
        with self._lock:
            scheduled = self._jobs.get(job_id)
        if scheduled is not None:
            scheduled.state.request_stop(reason, error)

    def first_published(self, job_id: str, stored_at: float) -> None:
        with self._lock:
            scheduled = self._jobs.get(job_id)
        if scheduled is not None and scheduled.first_published_at is None:
            scheduled.first_published_at = stored_at
