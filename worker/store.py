"""JobStore: the only code that writes job state to Redis.

Jobs live in a hash (``keys.job``) and their tokens in a list (``keys.job_tokens``). Transitions
that race (a worker claiming a job while a client cancels it, a crashed worker's job being
recovered while a stalled one wakes up) are single Lua scripts (``worker.scripts``), so each job
has exactly one outcome and only the current lease holder can write its tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import redis
from redis.client import Pipeline

from worker import keys, scripts
from worker.events import StepMessage, TokenEvent
from worker.jobs import (
    FinishReason,
    GenerationParams,
    Job,
    JobError,
    JobStatus,
    Usage,
    is_job_id,
)


class CancelOutcome(str, Enum):
    MISSING = "missing"
    CANCELED = "canceled"  # it was still queued: canceled on the spot
    REQUESTED = "requested"  # it is running: the worker stops it within one step
    ALREADY_FINISHED = "finished"


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


def _ownership_keys(job_id: str) -> list[str]:
    """The keys CLAIM and RECOVER touch, in the order the scripts expect them."""
    return [
        keys.job(job_id),
        keys.job_lease(job_id),
        keys.RUNNING_JOBS,
        keys.QUEUED_JOBS,
        keys.job_tokens(job_id),
    ]


def _done(job_id: str) -> str:
    return StepMessage(finished=[job_id]).encode()


def _changed(job_id: str) -> str:
    return StepMessage(changed=[job_id]).encode()


class JobStore:
    def __init__(self, client: redis.Redis, result_ttl_seconds: int, queued_ttl_seconds: int):
        self.redis = client
        self.result_ttl_seconds = result_ttl_seconds
        self.queued_ttl_seconds = queued_ttl_seconds
        self._scripts = {
            name: client.register_script(getattr(scripts, name))
            for name in (
                "CLAIM",
                "CANCEL",
                "RENEW",
                "RECOVER",
                "RELEASE",
                "EXPIRE_QUEUED",
                "APPEND_STEP",
                "FINISH",
            )
        }

    # -- web side -------------------------------------------------------------------------------

    def create(self, job: Job) -> None:
        self.create_many([job])

    def create_many(self, jobs: Sequence[Job]) -> None:
        """Record new jobs in one round trip (a batch can bring thousands)."""
        pipe = self.redis.pipeline(transaction=True)
        for job in jobs:
            self._queue_create(pipe, job)
        pipe.execute()

    def _queue_create(self, pipe: Pipeline, job: Job) -> None:
        fields: dict[Any, Any] = {
            "id": job.id,
            "model": job.model,
            "prompt": job.prompt,
            "params": json.dumps(job.params.to_dict()),
            "status": job.status.value,
            "created_at": repr(job.created_at),
            "prompt_tokens": str(job.usage.prompt_tokens),
            "attempts": "0",
        }
        if job.owner:
            fields["owner_key"] = job.owner
        if job.priority:
            fields["priority"] = str(job.priority)
        if job.webhook_url:
            fields["webhook_url"] = job.webhook_url
        if job.prompt_ids:
            fields["prompt_ids"] = " ".join(map(str, job.prompt_ids))
        if job.trace_context:
            fields["traceparent"] = job.trace_context
        pipe.hset(keys.job(job.id), mapping=fields)
        # Long enough to stay queued, then to be read as expired for a result TTL.
        pipe.expire(keys.job(job.id), self.queued_ttl_seconds + self.result_ttl_seconds)
        pipe.zadd(keys.QUEUED_JOBS, {job.id: job.created_at + self.queued_ttl_seconds})

    def model_of(self, job_id: str) -> str:
        """The job's model, for metrics and logs ("unknown" once the job has expired)."""
        return str(self.redis.hget(keys.job(job_id), "model") or "unknown")

    def get(self, job_id: str) -> Job | None:
        job, _events = self.snapshot(job_id, 0)
        return job

    def snapshot(self, job_id: str, from_index: int) -> tuple[Job | None, list[TokenEvent]]:
        """The job and its tokens from ``from_index`` on, read atomically.

        A running job's ``output`` is the text streamed so far (the whole replay log).
        """
        if not is_job_id(job_id):
            return None, []  # never a key built from a malformed id
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(keys.job(job_id))
        pipe.lrange(keys.job_tokens(job_id), 0, -1)
        fields, entries = pipe.execute()
        if not fields:
            return None, []
        job = _job_from_hash(fields)
        events = [TokenEvent.from_log_entry(job_id, raw) for raw in entries]
        if not job.status.is_terminal:
            job.output = "".join(event.text for event in events)
            job.usage = Usage(job.usage.prompt_tokens, len(events))
        return job, events[from_index:]

    def queue_position(self, job_id: str) -> int | None:
        """How many queued jobs (any model) were submitted before this one; None unless queued.

        An estimate, first come first counted: jobs of other models count too, and interactive
        jobs overtake batch jobs.
        """
        rank: Any = self.redis.zrank(keys.QUEUED_JOBS, job_id)
        return None if rank is None else int(rank)

    def cancel(self, job_id: str, now: float) -> CancelOutcome:
        return self.cancel_many([job_id], now)[0]

    def cancel_many(self, job_ids: Sequence[str], now: float) -> list[CancelOutcome]:
        """Cancel jobs in one round trip. CANCELED only for the call that canceled a queued
        job (once per job, however often it is asked): callers count on that."""
        valid = [job_id for job_id in job_ids if is_job_id(job_id)]
        pipe = self.redis.pipeline(transaction=False)
        for job_id in valid:
            self._scripts["CANCEL"](
                keys=[keys.job(job_id), keys.QUEUED_JOBS, keys.job_tokens(job_id)],
                args=[
                    job_id,
                    repr(now),
                    self.result_ttl_seconds,
                    keys.EVENTS_CHANNEL,
                    _done(job_id),
                ],
                client=pipe,
            )
        replies = dict(zip(valid, pipe.execute() if valid else [], strict=True))
        return [_cancel_outcome(replies.get(job_id, "missing")) for job_id in job_ids]

    # -- worker side: ownership -----------------------------------------------------------------

    def claim(self, job_id: str, node: str, now: float, lease_ms: int, max_attempts: int) -> Claim:
        """Take a queued job under a lease; the fence ("<node>:<attempt>") guards every write.

        Beyond ``max_attempts`` claims (its workers kept dying) the job fails instead.
        """
        error = JobError(
            "worker_lost",
            f"the job was attempted {max_attempts} times and its worker died each time",
        )
        outcome, attempt, *rest = self._scripts["CLAIM"](
            keys=_ownership_keys(job_id),
            args=[
                job_id,
                repr(now),
                node,
                lease_ms,
                max_attempts,
                json.dumps(error.to_dict()),
                self.result_ttl_seconds,
                keys.EVENTS_CHANNEL,
                _done(job_id),
                _changed(job_id),
            ],
        )
        raw_fields, logged = rest if rest else ([], 0)
        attempt = int(attempt)
        if outcome != "claimed":
            return Claim(ClaimOutcome(outcome), attempt, "")
        fields = dict(zip(raw_fields[::2], raw_fields[1::2], strict=True))
        return Claim(
            ClaimOutcome.CLAIMED, attempt, f"{node}:{attempt}", _job_from_hash(fields), int(logged)
        )

    def tokens(self, job_id: str) -> list[TokenEvent]:
        """The whole replay log (to resume a job whose previous worker died mid-stream)."""
        entries = self.redis.lrange(keys.job_tokens(job_id), 0, -1)
        return [TokenEvent.from_log_entry(job_id, raw) for raw in entries]

    def renew(self, leases: dict[str, str], lease_ms: int) -> list[str]:
        """Extend the leases this worker holds; returns the jobs whose lease it lost."""
        if not leases:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for job_id, fence in leases.items():
            self._scripts["RENEW"](
                keys=[keys.job_lease(job_id)], args=[fence, lease_ms], client=pipe
            )
        results = pipe.execute()
        return [job_id for job_id, ok in zip(leases, results, strict=True) if not ok]

    def release(self, job_id: str, fence: str, now: float) -> ReleaseOutcome:
        """Hand a claimed, not yet started job back (graceful shutdown).

        Returns "queued" (requeue it), "canceled" (a cancel was pending) or "lost" (not ours).
        """
        outcome = self._scripts["RELEASE"](
            keys=[keys.job(job_id), keys.job_lease(job_id), keys.RUNNING_JOBS, keys.QUEUED_JOBS],
            args=[
                job_id,
                fence,
                now + self.queued_ttl_seconds,
                repr(now),
                self.result_ttl_seconds,
                keys.EVENTS_CHANNEL,
                _done(job_id),
                _changed(job_id),
            ],
        )
        return {1: ReleaseOutcome.QUEUED, 2: ReleaseOutcome.CANCELED}.get(
            int(outcome), ReleaseOutcome.LOST
        )

    def recover_orphans(self, now: float) -> dict[str, RecoveryOutcome]:
        """Requeue running jobs whose lease expired (their worker died): id -> outcome."""
        running = [str(job_id) for job_id in self.redis.zrange(keys.RUNNING_JOBS, 0, -1)]
        outcomes: dict[str, RecoveryOutcome] = {}
        for job_id in running:
            outcome = self._scripts["RECOVER"](
                keys=_ownership_keys(job_id),
                args=[
                    job_id,
                    repr(now),
                    now + self.queued_ttl_seconds,
                    self.result_ttl_seconds,
                    keys.EVENTS_CHANNEL,
                    _done(job_id),
                    _changed(job_id),
                ],
            )
            if outcome != "alive":
                outcomes[job_id] = RecoveryOutcome(outcome)
        return outcomes

    def expire_queued(self, now: float) -> list[str]:
        """Fail queued jobs that waited past the queue TTL without any worker starting them."""
        expired = []
        overdue = [str(j) for j in self.redis.zrangebyscore(keys.QUEUED_JOBS, "-inf", now)]
        for job_id in overdue:
            error = JobError(
                "queue_timeout",
                f"no worker started the job within {self.queued_ttl_seconds} s",
            )
            done = self._scripts["EXPIRE_QUEUED"](
                keys=[keys.job(job_id), keys.QUEUED_JOBS, keys.job_tokens(job_id)],
                args=[
                    job_id,
                    repr(now),
                    json.dumps(error.to_dict()),
                    self.result_ttl_seconds,
                    keys.EVENTS_CHANNEL,
                    _done(job_id),
                ],
            )
            if done:
                expired.append(job_id)
        return expired

    # -- worker side: output --------------------------------------------------------------------

    def set_prompt_tokens(self, job_id: str, prompt_tokens: int) -> None:
        self.redis.hset(keys.job(job_id), "prompt_tokens", str(prompt_tokens))

    def queue_step(self, pipe: Pipeline, appends: Sequence[StepAppend]) -> None:
        """Add one flush of tokens to ``pipe``: one script, one PUBLISH, fenced per job."""
        script_keys: list[str] = [keys.EVENTS_CHANNEL]
        args: list[Any] = [len(appends)]
        for append in appends:
            script_keys += [
                keys.job(append.job_id),
                keys.job_tokens(append.job_id),
                keys.job_lease(append.job_id),
            ]
            first = "" if append.first_token_at is None else repr(append.first_token_at)
            fragment = ",".join(
                json.dumps([e.job_id, e.index, e.text, e.logprob], ensure_ascii=False)
                for e in append.events
            )
            args += [append.fence, first, append.events[0].index, len(append.events)]
            args += [event.to_log_entry() for event in append.events]
            args.append(fragment)
        self._scripts["APPEND_STEP"](keys=script_keys, args=args, client=pipe)

    @staticmethod
    def step_outcome(appends: Sequence[StepAppend], reply: Sequence[Any]) -> StepOutcome:
        count = len(appends)
        accepted, cancels = reply[:count], reply[count:]
        return StepOutcome(
            fenced_out=[a.job_id for a, ok in zip(appends, accepted, strict=True) if not ok],
            cancel_requested=[a.job_id for a, flag in zip(appends, cancels, strict=True) if flag],
        )

    def queue_finish(self, pipe: Pipeline, job_id: str, fence: str, result: JobResult) -> None:
        """Add a job's final state to ``pipe``; ignored unless this worker holds the lease."""
        args: list[Any] = [
            job_id,
            fence,
            self.result_ttl_seconds,
            keys.EVENTS_CHANNEL,
            _done(job_id),
        ]
        for name, value in result.fields().items():
            args += [name, value]
        self._scripts["FINISH"](
            keys=[
                keys.job(job_id),
                keys.job_tokens(job_id),
                keys.job_lease(job_id),
                keys.RUNNING_JOBS,
            ],
            args=args,
            client=pipe,
        )

    def finish(self, job_id: str, fence: str, result: JobResult) -> bool:
        """Store a final state outside the token path (failures before generation)."""
        pipe = self.redis.pipeline(transaction=False)
        self.queue_finish(pipe, job_id, fence, result)
        (stored,) = pipe.execute()
        return bool(stored)


def _cancel_outcome(reply: str) -> CancelOutcome:
    if reply in ("missing", "canceled", "requested"):
        return CancelOutcome(reply)
    return CancelOutcome.ALREADY_FINISHED


def _job_from_hash(fields: dict[str, str]) -> Job:
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
