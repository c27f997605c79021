"""JobStore: the only code that writes job state to Redis.

Jobs live in a hash (``keys.job``) and their tokens in a list (``keys.job_tokens``). Transitions
that race (a worker claiming a job while a client cancels it) are single Lua scripts, so each job
has exactly one outcome.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import redis

from worker import keys
from worker.events import StepMessage, TokenEvent
from worker.jobs import FinishReason, GenerationParams, Job, JobError, JobStatus, Usage

_CLAIM = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 'missing' end
if status ~= 'queued' then return status end
redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[1])
return 'claimed'
"""

_CANCEL = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 'missing' end
if status == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'canceled', 'finish_reason', 'canceled',
             'completed_at', ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 'canceled'
end
if status == 'running' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return 'requested'
end
return status
"""


class CancelOutcome(str, Enum):
    MISSING = "missing"
    CANCELED = "canceled"  # it was still queued: canceled on the spot
    REQUESTED = "requested"  # it is running: the worker stops it within one step
    ALREADY_FINISHED = "finished"


@dataclass(frozen=True)
class JobResult:
    """How a job ended, as the worker reports it."""

    status: JobStatus
    output: str
    finish_reason: FinishReason
    completion_tokens: int
    completed_at: float
    error: JobError | None = None


class JobStore:
    def __init__(self, client: redis.Redis, result_ttl_seconds: int, queued_ttl_seconds: int):
        self.redis = client
        self.result_ttl_seconds = result_ttl_seconds
        self.queued_ttl_seconds = queued_ttl_seconds
        self._claim = client.register_script(_CLAIM)
        self._cancel = client.register_script(_CANCEL)

    # -- web side -------------------------------------------------------------------------------

    def create(self, job: Job) -> None:
        fields: dict[Any, Any] = {
            "id": job.id,
            "model": job.model,
            "prompt": job.prompt,
            "params": json.dumps(job.params.to_dict()),
            "status": job.status.value,
            "created_at": repr(job.created_at),
            "prompt_tokens": str(job.usage.prompt_tokens),
        }
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.job(job.id), mapping=fields)
        pipe.expire(keys.job(job.id), self.queued_ttl_seconds)
        pipe.execute()

    def get(self, job_id: str) -> Job | None:
        job, _events = self.snapshot(job_id, 0)
        return job

    def snapshot(self, job_id: str, from_index: int) -> tuple[Job | None, list[TokenEvent]]:
        """The job and its tokens from ``from_index`` on, read atomically.

        A running job's ``output`` is the text streamed so far (the whole replay log).
        """
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

    def cancel(self, job_id: str, now: float) -> CancelOutcome:
        done = StepMessage(finished=[job_id]).encode()
        result = self._cancel(
            keys=[keys.job(job_id)],
            args=[repr(now), self.result_ttl_seconds, keys.EVENTS_CHANNEL, done],
        )
        if result in ("missing", "canceled", "requested"):
            return CancelOutcome(result)
        return CancelOutcome.ALREADY_FINISHED

    # -- worker side ----------------------------------------------------------------------------

    def claim(self, job_id: str, now: float) -> str:
        """Move a queued job to running; returns 'claimed', 'missing' or the status it had."""
        return str(self._claim(keys=[keys.job(job_id)], args=[repr(now)]))

    def set_prompt_tokens(self, job_id: str, prompt_tokens: int) -> None:
        self.redis.hset(keys.job(job_id), "prompt_tokens", str(prompt_tokens))

    def queue_tokens(
        self, pipe: Any, events: Sequence[TokenEvent], first_token_at: dict[str, float]
    ) -> None:
        """Add one flush worth of tokens to ``pipe``: an RPUSH per job, one timestamp per job."""
        by_job: dict[str, list[str]] = {}
        for event in events:
            by_job.setdefault(event.job_id, []).append(event.to_log_entry())
        for job_id, entries in by_job.items():
            pipe.rpush(keys.job_tokens(job_id), *entries)
            if job_id in first_token_at:
                pipe.hset(keys.job(job_id), "first_token_at", repr(first_token_at[job_id]))

    def queue_finish(self, pipe: Any, job_id: str, result: JobResult) -> None:
        """Add the final state of a job to ``pipe`` and start its result TTL."""
        fields = {
            "status": result.status.value,
            "output": result.output,
            "finish_reason": result.finish_reason.value,
            "completion_tokens": str(result.completion_tokens),
            "completed_at": repr(result.completed_at),
        }
        if result.error is not None:
            fields["error"] = json.dumps(result.error.to_dict())
        pipe.hset(keys.job(job_id), mapping=fields)
        pipe.expire(keys.job(job_id), self.result_ttl_seconds)
        pipe.expire(keys.job_tokens(job_id), self.result_ttl_seconds)

    def queue_cancel_check(self, pipe: Any, job_id: str) -> None:
        pipe.hget(keys.job(job_id), "cancel_requested")

    def finish(self, job_id: str, result: JobResult) -> None:
        """Store a final state and announce it, outside the token path (failures, skips)."""
        pipe = self.redis.pipeline(transaction=True)
        self.queue_finish(pipe, job_id, result)
        pipe.publish(keys.EVENTS_CHANNEL, StepMessage(finished=[job_id]).encode())
        pipe.execute()


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
    )
