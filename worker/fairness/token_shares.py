"""The dispatcher's side of the token shares (``worker.fairness.vtc``): what each job costs its key.

A job is charged when this worker claims it, at its prompt plus ``max_tokens`` (what it may
still cost: a long job counts as long from its start, not only once it has run), and the
charge is corrected when it ends to the tokens it was served. Which keys are at work here is
the dispatcher's to say (their running and held jobs).

A key ahead of its share waits only for a key that wants more than it has: one with jobs held
here, or with jobs waiting in its queues (``backlog``, a broker read made only when a key is
that far ahead). A key at work with one short job and nothing queued holds nobody back, so a
flood beside a light key keeps every row busy (work-conserving, as the paper's VTC, which
serves the least-served key *with queued requests*).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any

from worker.fairness.vtc import VirtualTokenCounter, job_cost


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

    def __init__(
        self, counter: VirtualTokenCounter, backlog: Callable[[str], bool] = lambda _: True
    ):
        """``backlog``: whether a key has jobs waiting in its queues (for any served model)."""
        self.counter = counter
        self._backlog = backlog
        self._charged: dict[str, tuple[str, float]] = {}  # job id -> (its key, its charge)
        self._lock = threading.Lock()

    def arriving(self, tenant: str, at_work: Iterable[str]) -> None:
        """A job of ``tenant`` arrived; ``at_work``: the keys with jobs here before it."""
        at_work = set(at_work)
        if tenant not in at_work:
            with self._lock:
                self.counter.activate(tenant, at_work)

    def must_wait(self, tenant: str, rivals: Iterable[str], held: Collection[str] = ()) -> bool:
        """Whether ``tenant``'s next job waits: a key of ``rivals`` (others at work here) is
        served ``lag_tokens`` less and wants more (its jobs ``held`` here, or a backlog)."""
        with self._lock:
            behind = [rival for rival in rivals if self.counter.ahead(tenant, [rival])]
        return any(rival in held or self._backlog(rival) for rival in behind)

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
