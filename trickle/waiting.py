"""Where a queued job stands and when it will start: the estimate every route shows a waiter.

Workers publish, per model, when each of their slots will be free (``WorkerOutlook``: their
running jobs' remaining tokens at the pace those jobs are measured to go, and the jobs they
claimed that wait for a lane) and how long a token takes a sequence now. The web tier orders the
model's queued jobs as the workers will take them (``service_order``) and hands each, in turn,
the slot that frees first (``start_times``): a job's estimated start is when its slot frees, and
the slot is busy again for that job's expected tokens at the measured pace. Pure logic: the
reading from Redis is ``trickle.waiting_reader``.
"""

from __future__ import annotations

import heapq
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerOutlook:
    """One worker's lanes for one model at ``at`` (wall clock), as it published them."""

    at: float
    # Seconds from ``at`` until each of its slots is free for a queued job (0: free now).
    free_in: tuple[float, ...]
    # A sequence's seconds per token at the current load (0: nothing measured yet).
    seconds_per_token: float
    # Recent finished jobs' tokens over their max_tokens: how much of its budget a job uses.
    length_ratio: float = 1.0
    # Jobs it claimed that wait for a lane (job id, seconds from ``at`` until it starts), in
    # the order they start: claimed, so "running", yet still waiting.
    claimed_waiting: tuple[tuple[str, float], ...] = ()
    # Its claims up to this moment (wall clock) are all in ``claimed_waiting`` or running: a
    # job it claimed by then and does not list is in a batch (None: as of ``at``).
    claims_through: float | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "at": round(self.at, 3),
                "free_in": [round(seconds, 4) for seconds in self.free_in],
                "spt": self.seconds_per_token,
                "ratio": round(self.length_ratio, 4),
                "claimed": [[job_id, round(start, 4)] for job_id, start in self.claimed_waiting],
                "through": self.claims_through,
            }
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> WorkerOutlook:
        data = json.loads(raw)
        through = data.get("through")
        return cls(
            float(data["at"]),
            tuple(float(seconds) for seconds in data["free_in"]),
            float(data["spt"]),
            float(data.get("ratio", 1.0)),
            tuple((str(job_id), float(start)) for job_id, start in data.get("claimed", ())),
            None if through is None else float(through),
        )

    @property
    def claims_seen_through(self) -> float:
        """Up to when its claims are accounted for: ``claims_through``, else ``at``."""
        return self.at if self.claims_through is None else self.claims_through


@dataclass(frozen=True)
class QueuedEntry:
    """A queued job as the estimate sees it: what orders it and how long it will hold a slot."""

    job_id: str
    submitted: float  # its queue score (submission order)
    priority: int  # lower is taken first (interactive before batch)
    tenant_digest: str  # its API key's digest: keys take turns
    max_tokens: int


@dataclass(frozen=True)
class Waiting:
    """What a waiter is told: queued jobs ahead of it, and seconds until it is expected to start
    (None: no live worker serves its model, or it is too far back to be read)."""

    position: int
    eta_seconds: float | None


def service_order(entries: Sequence[QueuedEntry]) -> list[QueuedEntry]:
    """The order workers take queued jobs in: by priority, and within one priority the keys
    take turns (their oldest job first), each key's jobs oldest first; without keys, plain
    submission order."""
    ordered: list[QueuedEntry] = []
    for priority in sorted({entry.priority for entry in entries}):
        by_owner: dict[str, list[QueuedEntry]] = {}
        for entry in sorted(entries, key=lambda e: e.submitted):
            if entry.priority == priority:
                by_owner.setdefault(entry.tenant_digest, []).append(entry)
        queues = list(by_owner.values())  # in the order of each key's oldest job
        for turn in range(max(len(queue) for queue in queues)):
            ordered.extend(queue[turn] for queue in queues if turn < len(queue))
    return ordered


def start_times(
    order: Sequence[QueuedEntry], outlooks: Sequence[WorkerOutlook], now: float
) -> list[float | None]:
    """Seconds from ``now`` until each job of ``order`` is expected to start (all None when no
    worker published an outlook): each job takes the slot that frees first and holds it for its
    expected tokens (max_tokens x the length ratio) at the measured seconds per token."""
    if not outlooks:
        return [None] * len(order)
    paces = [outlook.seconds_per_token for outlook in outlooks if outlook.seconds_per_token > 0]
    seconds_per_token = statistics.median(paces) if paces else 0.0
    ratio = statistics.median(outlook.length_ratio for outlook in outlooks)
    free: list[float] = []
    for outlook in outlooks:
        age = max(now - outlook.at, 0.0)
        free.extend(max(seconds - age, 0.0) for seconds in outlook.free_in)
    if not free:
        return [None] * len(order)
    heapq.heapify(free)
    starts: list[float | None] = []
    for entry in order:
        start = heapq.heappop(free)
        starts.append(start)
        heapq.heappush(free, start + max(entry.max_tokens * ratio, 1.0) * seconds_per_token)
    return starts


def slots_free_in(
    rows: Sequence[float], pending: Sequence[int], slots: int, pace: float
) -> tuple[list[float], list[float]]:
    """A worker's side of the estimate: seconds until each of its ``slots`` is free, from when
    its lanes' rows take a newcomer (``rows``, the soonest ``slots`` of them; a slot without a
    row is free now) and the jobs it claimed that wait for a lane (their expected tokens, at
    ``pace`` seconds per token), each taking the first free slot; and when each of those
    claimed jobs starts."""
    free = sorted(rows)[:slots]
    free.extend([0.0] * (slots - len(free)))
    if not free:
        return [], [0.0] * len(pending)
    heapq.heapify(free)
    starts = []
    for tokens in pending:
        start = heapq.heappop(free)
        starts.append(start)
        heapq.heappush(free, start + tokens * pace)
    return sorted(free), starts
