"""The places a named key's ``max_queued_jobs`` leaves its batch jobs, as a batch's reading
takes them (``web.batches.ingest``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from trickle.jobs import BATCH_PRIORITY, Job
from trickle.tenants import KeySettings
from web.admission.key_policy import check_key_policy
from web.batches.pending import Reservation
from web.services import Services


class KeyRoom:
    """The places a named key's ``max_queued_jobs`` leaves its batch jobs, per model: a line
    whose jobs find none waits (the reading pauses and resumes later, on a read of the batch
    or the sweep's turn) instead of failing ``key_queue_full``. The places are reserved with
    the jobs accepted but not yet sent (``web.batch_pending``), so a group's lines, or two
    batches, never overshoot the cap. A line that could never fit fails as it did."""

    def __init__(self, svc: Services, key: KeySettings | None):
        self._svc = svc
        self._key = key
        self._waiting: dict[str, int] = {}
        self._held: list[Reservation] = []

    def take(self, jobs: list[Job]) -> bool:
        key = self._key
        if key is None or not key.max_queued_jobs or not jobs:
            return True
        adding = Counter(job.model for job in jobs)
        if max(adding.values()) > key.max_queued_jobs:
            check_key_policy(self._svc, key, jobs)  # raises key_queue_full: it never fits
        for model in adding:
            if model not in self._waiting:
                self._waiting[model] = self._svc.queues.depth(model, key.name, BATCH_PRIORITY)
        reserved = self._svc.pending_batch.reserve_within(
            key.name, adding, self._waiting, key.max_queued_jobs
        )
        if isinstance(reserved, str):
            return False
        self._held.append(reserved)
        return True

    def hand_over(self) -> Callable[[], None]:
        """The places go to whoever calls the result (the fan-out, once the jobs are sent)."""
        handed = [reservation.hand_over() for reservation in self._held]
        self._held = []

        def release_all() -> None:
            for release in handed:
                release()

        return release_all

    def release(self) -> None:
        for reservation in self._held:
            reservation.release()
        self._held = []
