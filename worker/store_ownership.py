"""A worker's ownership of jobs: claims under a lease, renewals, hand-backs and the recovery of
jobs whose worker died. Each transition is one Lua script (``worker.scripts``), so a job has
exactly one owner and one outcome, whatever races with it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from worker import keys
from worker.events import DONE_MESSAGE, STATUS_MESSAGE, TokenEvent
from worker.job_records import (
    CLAIM_FIELDS,
    Claim,
    ClaimOutcome,
    RecoveryOutcome,
    ReleaseOutcome,
    hash_fields,
    job_from_hash,
)
from worker.jobs import JobError
from worker.store_base import StoreBase, ending_keys, ownership_keys


def _claim_from_reply(node: str, reply: list[Any]) -> Claim:
    """The CLAIM script's reply as a Claim: outcome, attempt, then the job's fields if taken."""
    outcome, attempt, *rest = reply
    values, logged, prompt = rest if rest else ([], 0, None)
    attempt = int(attempt)
    if outcome != "claimed":
        return Claim(ClaimOutcome(outcome), attempt, "")
    fields = hash_fields(CLAIM_FIELDS, values)
    if prompt:  # only when the worker must tokenize it (see CLAIM)
        fields["prompt"] = prompt
    return Claim(
        ClaimOutcome.CLAIMED, attempt, f"{node}:{attempt}", job_from_hash(fields), int(logged)
    )


class OwnershipTransitions(StoreBase):
    """Claim, renew, hand back and recover jobs: a worker's side of the lease."""

    def claim(self, job_id: str, node: str, now: float, lease_ms: int, max_attempts: int) -> Claim:
        """Take a queued job under a lease; the fence ("<node>:<attempt>") guards every write.

        Beyond ``max_attempts`` claims (its workers kept dying) the job fails instead.
        """
        (claim,) = self.claim_many([job_id], node, now, lease_ms, max_attempts)
        return claim

    def claim_many(
        self, job_ids: Sequence[str], node: str, now: float, lease_ms: int, max_attempts: int
    ) -> list[Claim]:
        """``claim`` for several jobs in one round trip (what a job feeder took at once)."""
        error = JobError(
            "worker_lost",
            f"the job was attempted {max_attempts} times and its worker died each time",
        )
        shared = [
            repr(now),
            node,
            lease_ms,
            max_attempts,
            json.dumps(error.to_dict()),
            self.result_ttl_seconds,
            self.publish,
            DONE_MESSAGE,
            STATUS_MESSAGE,
            *CLAIM_FIELDS,
        ]

        def build(pipe: Any) -> None:
            for job_id in job_ids:
                self.queue_script(pipe, "CLAIM", ownership_keys(job_id), [job_id, *shared])

        return [_claim_from_reply(node, reply) for reply in self.execute(build)]

    def tokens(self, job_id: str) -> list[TokenEvent]:
        """The whole replay log (to resume a job whose previous worker died mid-stream)."""
        entries = self.redis.lrange(keys.job_tokens(job_id), 0, -1)
        return [TokenEvent.from_log_entry(job_id, raw) for raw in entries]

    def renew(self, leases: dict[str, str], lease_ms: int) -> list[str]:
        """Extend the leases this worker holds; returns the jobs whose lease it lost."""
        if not leases:
            return []

        def build(pipe: Any) -> None:
            for job_id, fence in leases.items():
                self.queue_script(pipe, "RENEW", [keys.job_lease(job_id)], [fence, lease_ms])

        results = self.execute(build)
        return [job_id for job_id, ok in zip(leases, results, strict=True) if not ok]

    def release(self, job_id: str, fence: str, now: float) -> ReleaseOutcome:
        """Hand a claimed, not yet started job back (graceful shutdown).

        Returns "queued" (requeue it), "canceled" (a cancel was pending) or "lost" (not ours).
        """
        outcome = self._scripts["RELEASE"](
            keys=ownership_keys(job_id),
            args=[
                job_id,
                fence,
                now + self.queued_ttl_seconds,
                repr(now),
                self.result_ttl_seconds,
                self.publish,
                DONE_MESSAGE,
                STATUS_MESSAGE,
            ],
        )
        return {1: ReleaseOutcome.QUEUED, 2: ReleaseOutcome.CANCELED}.get(
            int(outcome), ReleaseOutcome.LOST
        )

    def recover_orphans(self, now: float) -> dict[str, RecoveryOutcome]:
        """Requeue running jobs whose lease expired (their worker died): id -> outcome."""
        outcomes: dict[str, RecoveryOutcome] = {}
        for job_id in self.running_ids():
            outcome = self._scripts["RECOVER"](
                keys=ownership_keys(job_id),
                args=[
                    job_id,
                    repr(now),
                    now + self.queued_ttl_seconds,
                    self.result_ttl_seconds,
                    self.publish,
                    DONE_MESSAGE,
                    STATUS_MESSAGE,
                ],
            )
            if outcome != "alive":
                outcomes[job_id] = RecoveryOutcome(outcome)
        return outcomes

    def expire_queued(self, now: float) -> list[str]:
        """Fail queued jobs that waited past the queue TTL without any worker starting them."""
        expired = []
        overdue = self._per_shard("zrangebyscore", keys.queued_jobs, "-inf", now)
        for job_id in [str(j) for shard in overdue for j in shard]:
            error = JobError(
                "queue_timeout",
                f"no worker started the job within {self.queued_ttl_seconds} s",
            )
            done = self._scripts["EXPIRE_QUEUED"](
                keys=[
                    keys.job(job_id),
                    keys.queued_jobs(keys.shard_of(job_id)),
                    *ending_keys(job_id),
                ],
                args=[
                    job_id,
                    repr(now),
                    json.dumps(error.to_dict()),
                    self.result_ttl_seconds,
                    self.publish,
                    DONE_MESSAGE,
                ],
            )
            if done:
                expired.append(job_id)
        return expired
