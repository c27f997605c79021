"""The job model shared by the web tier and the workers.

Values crossing a process boundary are dataclasses with explicit ``to_dict``/``from_dict``; a
job's Redis hash form is here too (``Job.to_hash`` and ``Job.from_hash``, ``JobResult.to_hash``),
so what is written and what is read back are one codec, beside the model it encodes.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from typing_extensions import TypedDict

from trickle import keys
from trickle.hop_timings import hop_seconds, timings_ms
from trickle.params import GenerationParams, ParamsObject

# Celery priorities on the Redis transport: 0 is fetched first.
INTERACTIVE_PRIORITY = 0
BATCH_PRIORITY = 9


class JobStatus(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    # Not started before its client's deadline (Cancel-After, ``deadline``): never run.
    EXPIRED = "expired"

    @property
    def is_terminal(self) -> bool:
        return self is not JobStatus.QUEUED and self is not JobStatus.RUNNING


class FinishReason(str, Enum):
    STOP = "stop"
    LENGTH = "length"
    CANCELED = "canceled"
    ERROR = "error"
    # Its client's deadline came: stopped with what it made, or (expired) never started.
    DEADLINE = "deadline"


JOB_ID_PATTERN = re.compile(r"job_[0-9a-f]{32}")


def new_job_id(shard: int | None = None) -> str:
    """An unguessable id (128 random bits): knowing one job's id reveals nothing about another.
    With ``shard``, one that lives in that shard (drawn again until it does: 256 draws on
    average, well under a millisecond), for records written with an idempotency key."""
    while True:
        job_id = "job_" + secrets.token_hex(16)
        if shard is None or keys.shard_of_uncached(job_id) == shard:
            return job_id


def is_job_id(value: str) -> bool:
    """Whether ``value`` has the form ``new_job_id`` gives: anything else names no job, and must
    never become part of a Redis key (``<id>:tokens`` would name another key's type)."""
    return JOB_ID_PATTERN.fullmatch(value) is not None


class JobErrorObject(TypedDict):
    type: str
    message: str


class UsageObject(TypedDict):
    prompt_tokens: int
    completion_tokens: int


class JobMetrics(TypedDict):
    queue_seconds: float | None
    time_to_first_token_seconds: float | None
    generation_seconds: float | None
    tokens_per_second: float | None


class JobObject(TypedDict):
    """The public job object (``Job.to_dict``); the API's Job schema is generated from it."""

    id: str
    object: Literal["job"]
    model: str
    status: JobStatus
    output: str
    finish_reason: FinishReason | None
    usage: UsageObject
    metrics: JobMetrics
    # The hops it went through so far, in ms (``trickle.hop_timings``).
    timings: dict[str, float]
    error: JobErrorObject | None
    params: ParamsObject
    created_at: float
    started_at: float | None
    completed_at: float | None
    deadline: float | None
    attempts: int


def context_overflow(prompt_tokens: int, max_tokens: int, context: int) -> str | None:
    """Why a prompt and its ``max_tokens`` do not fit a model's context, or None if they do.

    Checked by the web tier at submission and again by the worker (whose tokenization of a
    resumed prompt may differ)."""
    if prompt_tokens + max_tokens <= context:
        return None
    return (
        f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds "
        f"the model's context of {context} tokens"
    )


@dataclass(frozen=True)
class JobError:
    type: str
    message: str

    def to_dict(self) -> JobErrorObject:
        return {"type": self.type, "message": self.message}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobError:
        return cls(type=str(data["type"]), message=str(data["message"]))


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def to_dict(self) -> UsageObject:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


@dataclass
class Job:
    """One generation request and everything known about it so far."""

    id: str
    model: str
    prompt: str
    params: GenerationParams
    status: JobStatus = JobStatus.QUEUED
    output: str = ""
    finish_reason: FinishReason | None = None
    usage: Usage = field(default_factory=Usage)
    error: JobError | None = None
    created_at: float = 0.0
    started_at: float | None = None
    first_token_at: float | None = None
    completed_at: float | None = None
    # How many times a worker claimed it (more than one: it survived a worker's death).
    attempts: int = 0
    # Digest of the API key that created it ("" without keys): only that key may see it.
    tenant_digest: str = ""
    # Queue priority: INTERACTIVE jobs are always fetched before BATCH ones.
    priority: int = 0
    # Where to POST the finished job (allowlisted host), "" for none.
    webhook_url: str = ""
    # Internal, never served: the prompt as the web tier tokenized it (the worker reuses it, so a
    # prompt is tokenized once), and the W3C traceparent of the submitting request ("" untraced).
    prompt_ids: tuple[int, ...] = ()
    trace_context: str = ""
    # Internal: the stop string that ended it ("" otherwise), which Anthropic's answers name.
    stop_sequence: str = ""
    # How long its result is kept once it ends (0: ``limits.result_ttl_seconds``): a batch's
    # jobs keep theirs for the batch's window, until its output file is written.
    result_ttl_seconds: int = 0
    # When its request reached the web tier (0: unknown, an older record), and when a worker's
    # claim of it returned: the ends of its ``admit`` and ``claim`` hops.
    arrived_at: float = 0.0
    claimed_at: float | None = None
    # Its client's deadline (unix seconds, web.admission.deadline), None for none.
    deadline: float | None = None

    def hops(self) -> dict[str, float]:
        """The hops it went through so far, in seconds (``trickle.hop_timings``)."""
        return hop_seconds(
            self.arrived_at or None,
            self.created_at,
            self.left_queue_at,
            self.claimed_at,
            self.first_token_at,
            self.completed_at,
        )

    @property
    def left_queue_at(self) -> float | None:
        """When its wait in the queue ended: its start, or, for a job that ended without one
        (expired at its deadline, canceled or timed out while queued), its end."""
        return self.started_at if self.started_at is not None else self.completed_at

    def metrics(self) -> JobMetrics:
        """Timings a client cares about; time to first token counts from submission (the
        request's arrival, where known), so the hops before the first token add up to it."""

        def span(start: float | None, end: float | None) -> float | None:
            return None if start is None or end is None else round(max(end - start, 0.0), 6)

        generation = span(self.started_at, self.completed_at)
        tokens_per_second = None
        if generation and self.usage.completion_tokens:
            tokens_per_second = round(self.usage.completion_tokens / generation, 3)
        return {
            "queue_seconds": span(self.created_at, self.left_queue_at),
            "time_to_first_token_seconds": span(
                self.arrived_at or self.created_at, self.first_token_at
            ),
            "generation_seconds": generation,
            "tokens_per_second": tokens_per_second,
        }

    def to_dict(self) -> JobObject:
        """The public job object served by the API (the prompt is not echoed back)."""
        return {
            "id": self.id,
            "object": "job",
            "model": self.model,
            "status": self.status,  # a str enum: JSON writes its value
            "output": self.output,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict(),
            "metrics": self.metrics(),
            "timings": timings_ms(self.hops()),
            "error": self.error.to_dict() if self.error else None,
            "params": self.params.to_dict(),
            "created_at": self.created_at,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
            "deadline": self.deadline,
            "attempts": self.attempts,
        }

    def to_hash(self) -> dict[str, str]:
        """The record a new job is created with (``keys.job``); the Lua scripts add the rest
        (timings, attempts, results) as it runs. Optional fields are written only when set."""
        fields = {
            "id": self.id,
            "model": self.model,
            "prompt": self.prompt,
            "params": json.dumps(self.params.to_dict()),
            # Beside ``params`` so the wait estimate reads a queue's lengths without parsing
            # each job's params (a grammar can be most of them): ``trickle.waiting_reader``.
            "max_tokens": str(self.params.max_tokens),
            "status": self.status.value,
            "created_at": repr(self.created_at),
            "prompt_tokens": str(self.usage.prompt_tokens),
            "attempts": "0",  # CLAIM counts them
        }
        if self.tenant_digest:
            fields["tenant_digest"] = self.tenant_digest
        if self.priority:
            fields["priority"] = str(self.priority)
        if self.webhook_url:
            fields["webhook_url"] = self.webhook_url
        if self.prompt_ids:
            fields["prompt_ids"] = " ".join(map(str, self.prompt_ids))
        if self.trace_context:
            fields["traceparent"] = self.trace_context
        if self.result_ttl_seconds:
            fields["result_ttl"] = str(self.result_ttl_seconds)
        if self.arrived_at:
            fields["arrived_at"] = repr(self.arrived_at)
        if self.deadline is not None:
            fields["deadline"] = repr(self.deadline)
        return fields

    @classmethod
    def from_hash(cls, fields: Mapping[str, str]) -> Job:
        """The job a hash (or the fields of it that were read, ``hash_fields``) describes."""

        def optional_float(name: str) -> float | None:
            value = fields.get(name)
            return float(value) if value else None

        error = fields.get("error")
        finish_reason = fields.get("finish_reason")
        return cls(
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
            tenant_digest=fields.get("tenant_digest", ""),
            priority=int(fields.get("priority", 0)),
            webhook_url=fields.get("webhook_url", ""),
            prompt_ids=tuple(int(i) for i in fields.get("prompt_ids", "").split()),
            trace_context=fields.get("traceparent", ""),
            stop_sequence=fields.get("stop_sequence", ""),
            result_ttl_seconds=int(fields.get("result_ttl", 0)),
            arrived_at=float(fields.get("arrived_at", 0.0)),
            claimed_at=optional_float("claimed_at"),
            deadline=optional_float("deadline"),
        )


# Why an expired job was not run: the same whether a claim or the deadline sweep ended it.
# The job hash fields ``JobStore.get`` reads, and the record a finished job's done message carries
# (``store.scripts.FINISH``): all but the two that grow with the prompt (the worker's claim reads
# those), since a poller's GET never serves them.
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
    "tenant_digest",
    "priority",
    "webhook_url",
    "traceparent",
    "stop_sequence",
    "arrived_at",
    "claimed_at",
    "deadline",
)


def hash_fields(names: Sequence[str], values: Sequence[str | None]) -> dict[str, str]:
    """An HMGET reply as a hash (fields never set left out)."""
    return {name: value for name, value in zip(names, values, strict=True) if value is not None}
