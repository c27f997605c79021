"""The dispatcher's side of the token shares (``worker.vtc``): what each job costs its key.

A job is charged when this worker claims it, at its prompt plus ``max_tokens`` (what it may
still cost: a long job counts as long from its start, not only once it has run), and the
charge is corrected when it ends to the tokens it was served. Which keys are at work, and which
could take a freed slot, is the dispatcher's to say (its keys' running and held jobs).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from worker.vtc import VirtualTokenCounter, job_cost


def _estimate(claim: Any) -> float | None:
    """What a claimed job may cost: its prompt and the tokens it may still generate."""
    claim = getattr(claim, "claim", claim)  # a job the claim thread started (worker.runtime.Begun)
    job = getattr(claim, "job", None)
    if job is None or not getattr(claim, "claimed", False):
        return None
    remaining = job.params.max_tokens - getattr(claim, "logged_tokens", 0)
    return job_cost(job.usage.prompt_tokens, remaining)


def _served(claim: Any, estimate: float) -> float:
    """What an ended job cost, where its engine state says (else the estimate stands)."""
    scheduled = getattr(claim, "scheduled", None)
    job = getattr(getattr(claim, "claim", None), "job", None)
    if scheduled is None or job is None:
        return estimate
    return job_cost(job.usage.prompt_tokens, scheduled.state.count)


class TokenShares:
    """Token counters of the keys with work on this worker; thread-safe."""

    def __init__(self, counter: VirtualTokenCounter):
        self.counter = counter
        self._charged: dict[str, tuple[str, float]] = {}  # job id -> (its key, its charge)
        self._lock = threading.Lock()

    def arriving(self, tenant: str, at_work: Iterable[str]) -> None:
        """A job of ``tenant`` arrived; ``at_work``: the keys with jobs here before it."""
        at_work = set(at_work)
        if tenant not in at_work:
            with self._lock:
                self.counter.activate(tenant, at_work)

    def must_wait(self, tenant: str, rivals: Iterable[str]) -> bool:
        """Whether ``tenant``'s next job waits for the least-served of ``rivals`` (the other
        keys at work here that could take a free slot)."""
        with self._lock:
            return self.counter.ahead(tenant, rivals)

    def order(self, tenants: Iterable[str]) -> list[str]:
        with self._lock:
            return self.counter.least_served_first(tenants)

    def started(self, tenant: str, job_id: str, claim: Any) -> None:
        estimate = _estimate(claim)
        if estimate is None:
            return
        with self._lock:
            self._charged[job_id] = (tenant, estimate)
            self.counter.charge(tenant, estimate)

    def ended(self, job_id: str, claim: Any) -> None:
        with self._lock:
            charged = self._charged.pop(job_id, None)
            if charged is None:
                return
            tenant, estimate = charged
            self.counter.charge(tenant, _served(claim, estimate) - estimate)
