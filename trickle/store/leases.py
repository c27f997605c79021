"""Leases: a worker's ownership of jobs.

Claims under a lease, renewals, hand-backs and the recovery of jobs whose worker died. Each
transition is one Lua script (``trickle.store.scripts``), so a job has exactly one owner and one
outcome, whatever races with it; the fence a claim returns ("<node>:<attempt>") guards every
later write of the job (``JobStore``'s output). ``JobStore`` holds one, as ``store.leases``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from trickle import keys
from trickle.events import CLAIMED_MESSAGE, DONE_MESSAGE, STATUS_MESSAGE
from trickle.jobs import Job, JobError, hash_fields
from trickle.store.script_runner import ScriptRunner, ending_keys

# What a worker's claim reads: what it needs to run the job, not its results. The prompt comes
# too only when the worker must tokenize it (see scripts.CLAIM): the web tier's ids suffice.
CLAIM_FIELDS = (
    "id",
    "model",
    "params",
    "status",
    "created_at",
    "started_at",
    "prompt_tokens",
    "attempts",
    "priority",
    "webhook_url",
    "prompt_ids",
    "traceparent",
    "arrived_at",
    "deadline",
    "tenant_digest",  # its key's name: usage per key, and its queue when it is requeued
)


# Lapses of live workers forgiven per allowed death: past them, a job's lapses count again.
FORGIVEN_PER_ATTEMPT = 3


class ClaimOutcome(str, Enum):
    CLAIMED = "claimed"
    MISSING = "missing"
    POISONED = "poisoned"  # it killed too many workers already: failed, not run again
    # It is no longer queued: another copy of the message, or it was canceled or expired.
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    EXPIRED = "expired"


class ReleaseOutcome(str, Enum):
    """What handing a claimed job back did (graceful shutdown)."""

    QUEUED = "queued"  # back in the queue: enqueue its message again
    CANCELED = "canceled"  # a cancel was pending: it ended instead
    LOST = "lost"  # the lease was not ours any more


class RecoveryOutcome(str, Enum):
    """What the sweep did with a running job whose worker's lease lapsed."""

    REQUEUED = "requeued"
    CANCELED = "canceled"  # a cancel was pending: it ended instead of running again


@dataclass(frozen=True)
class Claim:
    """The result of trying to take a job: ``claimed`` with a fence, or why not."""

    outcome: ClaimOutcome
    attempt: int
    fence: str
    # Read in the same round trip as the claim: the job and the length of its replay log.
    job: Job | None = None
    logged_tokens: int = 0

    @property
    def claimed(self) -> bool:
        return self.outcome is ClaimOutcome.CLAIMED


def ownership_keys(job_id: str) -> list[str]:
    """The keys CLAIM, RECOVER and RELEASE touch, in the order the scripts expect them."""
    shard = keys.shard_of(job_id)
    return [
        keys.job(job_id),
        keys.job_lease(job_id),
        keys.running_jobs(shard),
        keys.queued_jobs(shard),
        *ending_keys(job_id),
    ]


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
        ClaimOutcome.CLAIMED, attempt, f"{node}:{attempt}", Job.from_hash(fields), int(logged)
    )


class Leases:
    """Claim, renew, hand back and recover jobs: a worker's side of the lease."""

    def __init__(self, runner: ScriptRunner, result_ttl_seconds: int, queued_ttl_seconds: int):
        self._runner = runner
        self.result_ttl_seconds = result_ttl_seconds
        self.queued_ttl_seconds = queued_ttl_seconds

    def claim(self, job_id: str, node: str, now: float, lease_ms: int, max_attempts: int) -> Claim:
        """Take a queued job under a lease; the fence ("<node>:<attempt>") guards every write.

        After ``max_attempts`` deaths of its workers that logged no token the job fails
        instead (see ``scripts.CLAIM``)."""
        (claim,) = self.claim_many([job_id], node, now, lease_ms, max_attempts)
        return claim

    def claim_many(
        self, job_ids: Sequence[str], node: str, now: float, lease_ms: int, max_attempts: int
    ) -> list[Claim]:
        """``claim`` for several jobs in one round trip (what a job feeder took at once)."""
        error = JobError(
            "worker_lost",
            f"its worker died {max_attempts} times before the job made progress",
        )
        shared = [
            repr(now),
            node,
            lease_ms,
            max_attempts,
            json.dumps(error.to_dict()),
            self.result_ttl_seconds,
            self._runner.publish,
            DONE_MESSAGE,
            CLAIMED_MESSAGE,
            *CLAIM_FIELDS,
        ]

        def build(pipe: Any) -> None:
            for job_id in job_ids:
                self._runner.queue_script(pipe, "CLAIM", ownership_keys(job_id), [job_id, *shared])

        return [_claim_from_reply(node, reply) for reply in self._runner.execute(build)]

    def renew(self, leases: dict[str, str], lease_ms: int) -> list[str]:
        """Extend the leases this worker holds (job id -> fence); returns the jobs whose lease
        it lost.

        A job whose final state this fence stored holds no lease (its FINISH deleted it) and
        lost none: ``scripts.RENEW`` says so from the job itself. A worker's renewal runs
        between a job's stored end and its removal from the worker's jobs; taking the missing
        lease for a lapse warned, stopped a finished copy and forgave a lapse in Redis (at 1.0x
        on the demo a dozen times a run, every one of a finished job)."""
        if not leases:
            return []

        def build(pipe: Any) -> None:
            for job_id, fence in leases.items():
                self._runner.queue_script(
                    pipe, "RENEW", [keys.job_lease(job_id), keys.job(job_id)], [fence, lease_ms]
                )

        results = self._runner.execute(build)
        return [job_id for job_id, held in zip(leases, results, strict=True) if held == 0]

    def forgive_lapse(self, job_id: str, fence: str, max_attempts: int) -> bool:
        """Say that this worker, alive, lost the lease it held with ``fence``: its lapse is
        not counted as a death toward ``max_attempts`` (see ``scripts.FORGIVE_LAPSE``), up to
        ``FORGIVEN_PER_ATTEMPT`` x ``max_attempts`` lapses of the job.

        A starved worker on a saturated machine renews late; counting its lapses as deaths
        failed jobs whose workers never died. True when a counted stall was taken back."""
        most = FORGIVEN_PER_ATTEMPT * max_attempts
        return bool(self._runner.run("FORGIVE_LAPSE", [keys.job(job_id)], [fence, most]))

    def release(self, job_id: str, fence: str, now: float) -> ReleaseOutcome:
        """Hand a claimed, not yet started job back (graceful shutdown).

        Returns "queued" (requeue it), "canceled" (a cancel was pending) or "lost" (not ours).
        """
        outcome = self._runner.run(
            "RELEASE",
            ownership_keys(job_id),
            [
                job_id,
                fence,
                now + self.queued_ttl_seconds,
                repr(now),
                self.result_ttl_seconds,
                self._runner.publish,
                DONE_MESSAGE,
                STATUS_MESSAGE,
            ],
        )
        return {1: ReleaseOutcome.QUEUED, 2: ReleaseOutcome.CANCELED}.get(
            int(outcome), ReleaseOutcome.LOST
        )

    def running_ids(self) -> list[str]:
        """Every job some worker holds (or held, until a sweep notices it died)."""
        members = self._runner.per_shard("zrange", keys.running_jobs, 0, -1)
        return [str(job_id) for shard in members for job_id in shard]

    def recover_orphans(self, now: float) -> dict[str, RecoveryOutcome]:
        """Requeue running jobs whose lease expired (their worker died): id -> outcome.

        A job that ended between the read of the running jobs and the check of its lease (its
        FINISH deletes both) lost no worker and is left out: at 1.0x on the demo, 10-48 of
        them a run were told as lost workers before."""
        outcomes: dict[str, RecoveryOutcome] = {}
        running = self.running_ids()
        if not running:
            return outcomes

        # One pipelined round trip finds the expired leases; RECOVER (which checks again,
        # atomically) runs only for those. A script call per running job made every sweep
        # cost the worker and Redis one round trip per job in flight (hundreds under load).
        def leases_of(pipe: Any) -> None:
            for job_id in running:
                pipe.exists(keys.job_lease(job_id))

        alive = self._runner.execute(leases_of)
        for job_id, held in zip(running, alive, strict=True):
            if held:
                continue
            outcome = self._runner.run(
                "RECOVER",
                ownership_keys(job_id),
                [
                    job_id,
                    repr(now),
                    now + self.queued_ttl_seconds,
                    self.result_ttl_seconds,
                    self._runner.publish,
                    DONE_MESSAGE,
                    STATUS_MESSAGE,
                ],
            )
            if outcome not in ("alive", "gone"):
                outcomes[job_id] = RecoveryOutcome(outcome)
        return outcomes
