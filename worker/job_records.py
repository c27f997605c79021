"""What JobStore reads and writes: claims, results, step appends, and a job hash as a Job.

Plain values and their Redis hash form, kept apart from the store's Redis calls.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from worker.events import TokenEvent
from worker.jobs import FinishReason, GenerationParams, Job, JobError, JobStatus, Usage


class ClaimOutcome(str, Enum):
    CLAIMED = "claimed"
    MISSING = "missing"
    POISONED = "poisoned"  # it killed too many workers already: failed, not run again
    # It is no longer queued: another copy of the message, or it was canceled or expired.
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


class ReleaseOutcome(str, Enum):
    """What handing a claimed job back did (graceful shutdown)."""

    QUEUED = "queued"  # back in the queue: enqueue its message again
    CANCELED = "canceled"  # a cancel was pending: it ended instead
    LOST = "lost"  # the lease was not ours any more


class RecoveryOutcome(str, Enum):
    """What the sweep did with a running job whose worker's lease lapsed."""

    REQUEUED = "requeued"
    CANCELED = "canceled"  # a cancel was pending: it ended instead of running again
    GONE = "gone"  # it had finished meanwhile


class CancelOutcome(str, Enum):
    MISSING = "missing"
    CANCELED = "canceled"  # it was still queued: canceled on the spot
    REQUESTED = "requested"  # it is running: the worker stops it at its next flush
    ALREADY_FINISHED = "finished"


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


@dataclass(frozen=True)
class JobResult:
    """How a job ended, as the worker reports it."""

    status: JobStatus
    output: str
    finish_reason: FinishReason
    completion_tokens: int
    completed_at: float
    error: JobError | None = None

    @classmethod
    def failed(cls, error: JobError, output: str, completion_tokens: int) -> JobResult:
        """A failure keeps what was already streamed, so output and stream still agree."""
        return cls(
            JobStatus.FAILED, output, FinishReason.ERROR, completion_tokens, time.time(), error
        )

    def fields(self) -> dict[str, str]:
        values = {
            "status": self.status.value,
            "output": self.output,
            "finish_reason": self.finish_reason.value,
            "completion_tokens": str(self.completion_tokens),
            "completed_at": repr(self.completed_at),
        }
        if self.error is not None:
            values["error"] = json.dumps(self.error.to_dict())
        return values


@dataclass(frozen=True)
class StepAppend:
    """One job's share of a publisher flush."""

    job_id: str
    fence: str
    events: Sequence[TokenEvent]
    first_token_at: float | None = None


@dataclass(frozen=True)
class StepOutcome:
    fenced_out: list[str]  # jobs whose lease this worker no longer holds
    cancel_requested: list[str]


def cancel_outcome(reply: str) -> CancelOutcome:
    if reply in ("missing", "canceled", "requested"):
        return CancelOutcome(reply)
    return CancelOutcome.ALREADY_FINISHED


# The job hash fields ``JobStore.get`` reads: all but the two that grow with the prompt (the
# worker's claim reads those), since a poller's GET never serves them.
READ_FIELDS = (
    "id",
    "model",
    "params",
    "status",
    "output",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "error",
    "created_at",
    "started_at",
    "first_token_at",
    "completed_at",
    "attempts",
    "owner_key",
    "priority",
    "webhook_url",
    "traceparent",
)


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
    "owner_key",  # its key's name: usage per key, and its queue when it is requeued
)


def hash_fields(names: Sequence[str], values: Sequence[str | None]) -> dict[str, str]:
    """An HMGET reply as a hash (fields never set left out)."""
    return {name: value for name, value in zip(names, values, strict=True) if value is not None}


def job_from_hash(fields: dict[str, str]) -> Job:
    def optional_float(name: str) -> float | None:
        value = fields.get(name)
        return float(value) if value else None

    error = fields.get("error")
    finish_reason = fields.get("finish_reason")
    return Job(
        id=fields["id"],
        model=fields["model"],
        prompt=fields.get("prompt", ""),
        params=GenerationParams.from_dict(json.loads(fields["params"])),
        status=JobStatus(fields["status"]),
        output=fields.get("output", ""),
        finish_reason=FinishReason(finish_reason) if finish_reason else None,
        usage=Usage(
            prompt_tokens=int(fields.get("prompt_tokens", 0)),
            completion_tokens=int(fields.get("completion_tokens", 0)),
        ),
        error=JobError.from_dict(json.loads(error)) if error else None,
        created_at=float(fields.get("created_at", 0.0)),
        started_at=optional_float("started_at"),
        first_token_at=optional_float("first_token_at"),
        completed_at=optional_float("completed_at"),
        attempts=int(fields.get("attempts", 0)),
        owner=fields.get("owner_key", ""),
        priority=int(fields.get("priority", 0)),
        webhook_url=fields.get("webhook_url", ""),
        prompt_ids=tuple(int(i) for i in fields.get("prompt_ids", "").split()),
        trace_context=fields.get("traceparent", ""),
    )
