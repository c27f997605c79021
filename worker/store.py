"""JobStore: the only code that writes job state to Redis.

Jobs live in a hash (``keys.job``), their tokens in a list (``keys.job_tokens``) and, while they
run, the text streamed so far in a string (``keys.job_output``), so reading a job never parses
its log. Transitions that race (a worker claiming a job while a client cancels it, a crashed
worker's job being recovered while a stalled one wakes up) are single Lua scripts
(``worker.scripts``), so each job has exactly one outcome and only the current lease holder can
write its tokens. This module holds the web tier's part (records, reads, queue counts, cancel);
a worker's ownership transitions are in ``store_ownership``, its output in ``store_output``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from worker import keys
from worker.events import DONE_MESSAGE, TokenEvent
from worker.job_records import (
    READ_FIELDS,
    CancelOutcome,
    Claim,
    ClaimOutcome,
    JobResult,
    RecoveryOutcome,
    ReleaseOutcome,
    StepAppend,
    StepOutcome,
    cancel_outcome,
    hash_fields,
    job_from_hash,
)
from worker.jobs import Job, JobStatus, Usage, is_job_id
from worker.store_base import ending_keys
from worker.store_output import OutputWrites
from worker.store_ownership import OwnershipTransitions

__all__ = [
    "CancelOutcome",
    "Claim",
    "ClaimOutcome",
    "JobResult",
    "JobStore",
    "RecoveryOutcome",
    "ReleaseOutcome",
    "StepAppend",
    "StepOutcome",
]


class JobStore(OwnershipTransitions, OutputWrites):
    """Every read and write of job state (the web tier's part here; see the module doc)."""

    # -- web side -------------------------------------------------------------------------------

    def create(self, job: Job, also: Callable[[Any], object] | None = None) -> None:
        """Record a new job; ``also`` adds commands for the same Redis to the same transaction
        (the web tier's task message: the record and its message arrive together, in one round
        trip, with no other request's work between them)."""
        self.create_many([job], also)

    def create_many(self, jobs: Sequence[Job], also: Callable[[Any], object] | None = None) -> None:
        """Record new jobs in one round trip (a batch can bring thousands); atomic on a single
        Redis, per job on a cluster (jobs live on different slots)."""
        pipe = self.pipeline(transaction=not self.cluster)
        for job in jobs:
            self.queue_create(pipe, job)
        if also is not None:
            also(pipe)
        pipe.execute()

    def create_once(
        self, key: str, record: str, ttl_seconds: int, writes: Callable[[Any], object]
    ) -> str | None:
        """Run ``writes`` (a request's records, queued on the recorder it is given) only if the
        idempotency ``key`` is new, in one script with the key's own ``record``; returns the
        key's existing record instead when it is not new. On a cluster every key written must
        share the idempotency key's slot (its jobs are drawn in its shard)."""
        recorder = WriteRecorder(key)
        writes(recorder)
        existing = self._scripts["CREATE_ONCE"](
            keys=recorder.keys, args=[record, ttl_seconds, json.dumps(recorder.writes)]
        )
        if existing is None:
            return None
        return existing.decode() if isinstance(existing, bytes) else str(existing)

    def create_jobs_once(
        self, key: str, record: str, ttl_seconds: int, jobs: Sequence[Job]
    ) -> str | None:
        """``create_many`` under an idempotency key (``create_once``)."""

        def writes(recorder: Any) -> None:
            for job in jobs:
                self.queue_create(recorder, job)

        return self.create_once(key, record, ttl_seconds, writes)

    def delete_unpublished(self, job_ids: Sequence[str], idempotency_key: str = "") -> None:
        """Take back records whose task could not be published (the broker was down): no
        worker can have them, and the caller was told nothing was created (so the key that
        would have named them goes too)."""
        pipe = self.pipeline(transaction=not self.cluster)
        for job_id in job_ids:
            pipe.delete(keys.job(job_id))
            pipe.zrem(keys.queued_jobs(keys.shard_of(job_id)), job_id)
        if idempotency_key:
            pipe.delete(idempotency_key)
        pipe.execute()

    def queue_create(self, pipe: Any, job: Job) -> None:
        """Queue the writes of a new job's record on ``pipe`` (a pipeline or a WriteRecorder)."""
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
        queued = keys.queued_jobs(keys.shard_of(job.id))
        pipe.zadd(queued, {job.id: job.created_at + self.queued_ttl_seconds})

    def model_of(self, job_id: str) -> str:
        """The job's model, for metrics and logs ("unknown" once the job has expired)."""
        return str(self.redis.hget(keys.job(job_id), "model") or "unknown")

    def get(self, job_id: str) -> Job | None:
        """The job as served: a finished job's stored output, a running one's output so far
        (one string read), never the replay log, nor the prompt (only the worker needs it)."""
        job, _events = self._read(job_id, None)
        return job

    def status(self, job_id: str) -> JobStatus | None:
        """Just the status (a waiter polling for the end reads a few bytes, not the job)."""
        if not is_job_id(job_id):
            return None
        value = self.redis.hget(keys.job(job_id), "status")
        return JobStatus(value) if value else None

    def owner(self, job_id: str) -> str | None:
        """The digest of the API key that created the job ("" without keys), None if the job
        does not exist: enough to tell a caller it may wait for the job."""
        if not is_job_id(job_id):
            return None
        status, owner = self.redis.hmget(keys.job(job_id), ["status", "owner_key"])
        return None if status is None else str(owner or "")

    def snapshot(self, job_id: str, from_index: int) -> tuple[Job | None, list[TokenEvent]]:
        """The job (as ``get``) and its tokens from ``from_index`` on, read atomically."""
        return self._read(job_id, from_index)

    def _read(self, job_id: str, from_index: int | None) -> tuple[Job | None, list[TokenEvent]]:
        if not is_job_id(job_id):
            return None, []  # never a key built from a malformed id
        pipe = self.pipeline(transaction=True)
        pipe.hmget(keys.job(job_id), READ_FIELDS)
        pipe.get(keys.job_output(job_id))
        pipe.llen(keys.job_tokens(job_id))
        if from_index is not None:
            pipe.lrange(keys.job_tokens(job_id), from_index, -1)
        values, output, logged, *tail = pipe.execute()
        fields = hash_fields(READ_FIELDS, values)
        if "id" not in fields:
            return None, []
        job = job_from_hash(fields)
        if not job.status.is_terminal:
            job.output = output or ""
            job.usage = Usage(job.usage.prompt_tokens, int(logged))
        entries = tail[0] if tail else []
        return job, [TokenEvent.from_log_entry(job_id, raw) for raw in entries]

    def oldest_queued(self, count: int) -> list[str]:
        """The ids of up to ``count`` queued jobs with the earliest queue deadlines (the oldest
        submissions), over every shard."""
        found = self._per_shard("zrange", keys.queued_jobs, 0, count - 1, withscores=True)
        entries = sorted((score, str(job_id)) for shard in found for job_id, score in shard)
        return [job_id for _score, job_id in entries[:count]]

    def queued_before(self, created_before: float) -> list[str]:
        """Queued jobs submitted before ``created_before`` (the index scores queue deadlines:
        submission + queued TTL)."""
        deadline = created_before + self.queued_ttl_seconds
        found = self._per_shard("zrangebyscore", keys.queued_jobs, "-inf", repr(deadline))
        return [str(job_id) for shard in found for job_id in shard]

    def claim_republish(self, job_id: str, seconds: float) -> bool:
        """True for the one sweep that may publish this job's task again in ``seconds``."""
        lock = keys.job_republished(job_id)
        return bool(self.redis.set(lock, "1", nx=True, ex=max(int(seconds), 1)))

    def queue_position(self, job_id: str) -> int | None:
        """How many queued jobs (any model) were submitted before this one; None unless queued.

        An estimate, first come first counted: jobs of other models count too, and interactive
        jobs overtake batch jobs. (Queue deadlines order submissions: created + queue TTL.)
        """
        deadline = self.redis.zscore(keys.queued_jobs(keys.shard_of(job_id)), job_id)
        if deadline is None:
            return None
        return self._sum_per_shard("zcount", keys.queued_jobs, "-inf", f"({deadline!r}")

    def queued_count(self) -> int:
        """Jobs waiting for a worker, all models and priorities (the batch backlog bound)."""
        return self._sum_per_shard("zcard", keys.queued_jobs)

    def running_count(self) -> int:
        return self._sum_per_shard("zcard", keys.running_jobs)

    def cancel(self, job_id: str, now: float) -> CancelOutcome:
        return self.cancel_many([job_id], now)[0]

    def cancel_many(self, job_ids: Sequence[str], now: float) -> list[CancelOutcome]:
        """Cancel jobs in one round trip. CANCELED only for the call that canceled a queued
        job (once per job, however often it is asked): callers count on that."""
        valid = [job_id for job_id in job_ids if is_job_id(job_id)]

        def build(pipe: Any) -> None:
            for job_id in valid:
                shard = keys.shard_of(job_id)
                self.queue_script(
                    pipe,
                    "CANCEL",
                    [keys.job(job_id), keys.queued_jobs(shard), *ending_keys(job_id)],
                    [job_id, repr(now), self.result_ttl_seconds, self.publish, DONE_MESSAGE],
                )

        replies = dict(zip(valid, self.execute(build) if valid else [], strict=True))
        return [cancel_outcome(replies.get(job_id, "missing")) for job_id in job_ids]


class WriteRecorder:
    """Stands in for a pipeline: records the writes queued on it as [command, key index, args]
    for the CREATE_ONCE script, and the keys they touch (KEYS[1] is the idempotency key)."""

    def __init__(self, first_key: str):
        self.keys = [first_key]
        self.writes: list[list[Any]] = []

    def _key(self, name: str) -> int:
        if name not in self.keys:
            self.keys.append(name)
        return self.keys.index(name) + 1  # Lua's KEYS start at 1

    def hset(self, name: str, mapping: dict[str, Any]) -> None:
        flat = [str(part) for pair in mapping.items() for part in pair]
        self.writes.append(["HSET", self._key(name), *flat])

    def expire(self, name: str, seconds: int) -> None:
        self.writes.append(["EXPIRE", self._key(name), int(seconds)])

    def zadd(self, name: str, mapping: dict[str, float]) -> None:
        flat = [part for member, score in mapping.items() for part in (repr(score), member)]
        self.writes.append(["ZADD", self._key(name), *flat])

    def rpush(self, name: str, *values: str) -> None:
        for start in range(0, len(values), 1000):  # Lua's unpack() takes a few thousand at most
            self.writes.append(["RPUSH", self._key(name), *values[start : start + 1000]])
