"""Batches in Redis: a hash per batch and a list of its requests, each mapped to its jobs.

A batch holds no results of its own: its status, counts and output are derived from its jobs,
which run through the same queue and workers as everything else (at batch priority).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field, fields
from typing import Any

import redis

from trickle import keys
from web.common.turns import in_turns

BATCH_ID_PATTERN = re.compile(r"batch_[0-9a-f]{32}")
# A group of read lines is appended only if the batch's read offset is still the one its
# reading started from: KEYS batch, items; ARGV offset from, offset to, total, lines refused,
# item entries. The refused lines count as failed at once (``failed``).
APPEND_GROUP = """
if redis.call('HGET', KEYS[1], 'ingest_offset') ~= ARGV[1] then return 0 end
if #ARGV > 4 then redis.call('RPUSH', KEYS[2], unpack(ARGV, 5)) end
redis.call('HSET', KEYS[1], 'ingest_offset', ARGV[2], 'total', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'failed', ARGV[4])
return 1
"""
# A batch's counts as its settle task found them, kept only while it is in progress: a slower
# task never writes over the final counts. KEYS batch; ARGV completed, failed.
KEEP_COUNTS = """
if redis.call('HGET', KEYS[1], 'stage') ~= 'in_progress' then return 0 end
redis.call('HSET', KEYS[1], 'completed', ARGV[1], 'failed', ARGV[2])
return 1
"""
# A refused line's stored error message is cut here: some messages quote the input (a model
# name), and the input may be as long as the whole batch allows.
MAX_ERROR_MESSAGE_CHARS = 500


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(16)


def is_batch_id(value: str) -> bool:
    """Whether ``value`` is a batch id (see ``trickle.jobs.is_job_id`` for why this matters)."""
    return BATCH_ID_PATTERN.fullmatch(value) is not None


@dataclass
class BatchItem:
    """One input line: its jobs when valid, else the error it was refused with.

    A refused line keeps only what the output file says of it (its ``custom_id`` and error):
    its body, which may hold a prompt far over the token limit, is dropped at once, so lines no
    job, backlog or token limit counts cannot fill Redis for the batch's lifetime.
    """

    custom_id: str
    url: str
    body: dict[str, Any]
    job_ids: list[str] = field(default_factory=list)
    error_status: int | None = None
    error: dict[str, Any] | None = None
    # The output room held for the line (web/batches/output_room.py), in bytes.
    output_hold: int = 0

    def refuse(self, status: int, error: dict[str, Any]) -> None:
        message = str(error.get("message", ""))
        if len(message) > MAX_ERROR_MESSAGE_CHARS:
            message = message[:MAX_ERROR_MESSAGE_CHARS] + "..."
        self.error_status, self.error = status, {**error, "message": message}
        self.body, self.job_ids = {}, []

    def to_dict(self) -> dict[str, Any]:
        head = {"custom_id": self.custom_id, "url": self.url}
        held = {"output_hold": self.output_hold} if self.output_hold else {}
        if self.error is not None:
            return {**head, "error_status": self.error_status, "error": self.error, **held}
        return {**head, "body": self.body, "job_ids": self.job_ids, **held}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchItem:
        return cls(
            custom_id=str(data["custom_id"]),
            url=str(data["url"]),
            body=dict(data.get("body") or {}),
            job_ids=[str(job_id) for job_id in data.get("job_ids") or []],
            error_status=data.get("error_status"),
            error=data.get("error"),
            output_hold=int(data.get("output_hold") or 0),
        )


# Stages a batch's record holds; ``in_progress`` also while it is being cancelled (its
# ``cancelling_at`` tells), ``finalizing`` while one web process writes its output files.
STAGES = ("validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelled")
FINAL_STAGES = ("completed", "failed", "expired", "cancelled")


@dataclass
class BatchRecord:
    """A batch's hash: who made it, when, for which endpoint, and the stage it reached; its
    counts as its reading and settle tasks last found them (so a read counts nothing). The
    object the API answers is ``web.common.response_models.Batch``."""

    id: str
    tenant_digest: str
    created_at: float
    endpoint: str
    total: int
    stage: str = "in_progress"
    cancelling_at: float | None = None
    input_file_id: str | None = None
    metadata: dict[str, Any] | None = None
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelled_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None
    # Lines done: refused ones as they are read, then each settle task's tally, then the
    # output files' lines once they are written.
    completed: int | None = None
    failed: int | None = None
    # A file batch's input is read up to this byte (a resumed reading starts there).
    ingest_offset: int | None = None
    # The input it holds (its JSONL body, or its input file's size): web.batches.quota.
    input_bytes: int | None = None
    # The urls its lines may name when more than ``endpoint`` (a JSONL body's may mix them:
    # its ``endpoint`` is the first line's url until the reading ends, then that or "mixed").
    urls: list[str] | None = None

    def to_hash(self) -> dict[str, str]:
        fields = {
            "id": self.id,
            "tenant_digest": self.tenant_digest,
            "created_at": repr(self.created_at),
            "endpoint": self.endpoint,
            "total": str(self.total),
            "stage": self.stage,
        }
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                fields[name] = json.dumps(value)
        return fields

    @classmethod
    def from_hash(cls, fields: dict[str, str]) -> BatchRecord:
        optional = {name: json.loads(fields[name]) for name in _OPTIONAL if name in fields}
        return cls(
            id=fields["id"],
            tenant_digest=fields.get("tenant_digest", ""),
            created_at=float(fields["created_at"]),
            endpoint=fields["endpoint"],
            total=int(fields["total"]),
            stage=fields.get("stage", "in_progress"),
            **optional,
        )


# Every optional field a record may hold (those that default to None), stored as JSON when set.
_OPTIONAL = tuple(item.name for item in fields(BatchRecord) if item.default is None)


class BatchStore:
    def __init__(self, client: redis.Redis, ttl_seconds: int):
        self.redis: Any = client
        self.ttl_seconds = ttl_seconds
        self._append_group = client.register_script(APPEND_GROUP)
        self._keep_counts = client.register_script(KEEP_COUNTS)

    def create(self, batch: BatchRecord, items: list[BatchItem]) -> None:
        pipe = self.redis.pipeline(transaction=True)
        self.queue_create(pipe, batch, items)
        pipe.execute()
        self.index(batch)

    def index(self, batch: BatchRecord) -> None:
        """Lists a created batch under its tenant (another slot on a cluster: its own call)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(keys.batches_of(batch.tenant_digest), {batch.id: batch.created_at})
        pipe.expire(keys.batches_of(batch.tenant_digest), self.ttl_seconds)
        # Batches whose record has expired leave the tenant's list (a list only reads).
        older = batch.created_at - self.ttl_seconds
        pipe.zremrangebyscore(keys.batches_of(batch.tenant_digest), "-inf", older)
        pipe.zadd(keys.batches_unsettled(), {batch.id: batch.created_at})
        # Batches no sweep saw end (sweeping off) leave the set once their record is gone.
        pipe.zremrangebyscore(keys.batches_unsettled(), "-inf", older)
        pipe.execute()

    def unsettled(self) -> list[str]:
        """The batches not yet in a final stage (or gone since), oldest first."""
        return list(self.redis.zrange(keys.batches_unsettled(), 0, -1))

    def settled(self, batch_id: str, pipe: Any = None) -> None:
        (pipe if pipe is not None else self.redis).zrem(keys.batches_unsettled(), batch_id)

    def queue_create(self, pipe: Any, batch: BatchRecord, items: list[BatchItem]) -> None:
        """Queue a new batch's writes on ``pipe`` (a pipeline, or the idempotent create's
        recorder: the batch, its jobs and the key then land in one script)."""
        pipe.hset(keys.batch(batch.id), mapping=batch.to_hash())
        if items:
            entries = [json.dumps(item.to_dict()) for item in in_turns(items, 200)]
            pipe.rpush(keys.batch_items(batch.id), *entries)
        pipe.expire(keys.batch(batch.id), self.ttl_seconds)
        pipe.expire(keys.batch_items(batch.id), self.ttl_seconds)

    def get(self, batch_id: str) -> tuple[BatchRecord, list[BatchItem]] | None:
        if not is_batch_id(batch_id):
            return None
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(keys.batch(batch_id))
        pipe.lrange(keys.batch_items(batch_id), 0, -1)
        fields, entries = pipe.execute()
        if not fields:
            return None
        items = [BatchItem.from_dict(json.loads(entry)) for entry in entries]
        return BatchRecord.from_hash(fields), items

    def mark_cancelled(self, batch_id: str, now: float) -> None:
        self.redis.hsetnx(keys.batch(batch_id), "cancelling_at", json.dumps(now))

    def update(self, batch_id: str, pipe: Any = None, **values: Any) -> None:
        """Sets optional fields (JSON) and ``stage``/``total``/``endpoint`` (plain), on ``pipe``
        if given."""
        fields = {
            name: (str(value) if name in ("stage", "total", "endpoint") else json.dumps(value))
            for name, value in values.items()
        }
        (pipe if pipe is not None else self.redis).hset(keys.batch(batch_id), mapping=fields)

    def append_group(
        self, batch_id: str, items: list[BatchItem], read_from: int, read_to: int, total: int
    ) -> bool:
        """Appends a group of read lines' items and moves the read offset from ``read_from``
        to ``read_to`` (``total`` lines read), unless another reading moved it first: then
        nothing is written and the answer is False."""
        entries = [json.dumps(item.to_dict()) for item in items]
        refused = sum(1 for item in items if item.error is not None)
        keys_ = [keys.batch(batch_id), keys.batch_items(batch_id)]
        args = [json.dumps(read_from), json.dumps(read_to), str(total), str(refused), *entries]
        return bool(self._append_group(keys=keys_, args=args))

    def keep_counts(self, batch_id: str, completed: int, failed: int) -> None:
        """The counts a settle task found, for reads to answer with (none once it is final)."""
        self._keep_counts(keys=[keys.batch(batch_id)], args=[str(completed), str(failed)])

    def items(self, batch_id: str, start: int, count: int) -> list[BatchItem]:
        """``count`` of the batch's items from ``start``: a large batch is read in slices."""
        entries = self.redis.lrange(keys.batch_items(batch_id), start, start + count - 1)
        return [BatchItem.from_dict(json.loads(entry)) for entry in entries]

    def record(self, batch_id: str) -> BatchRecord | None:
        if not is_batch_id(batch_id):
            return None
        fields = self.redis.hgetall(keys.batch(batch_id))
        return BatchRecord.from_hash(fields) if fields else None

    def of_tenant(self, tenant_digest: str) -> list[str]:
        """The tenant's batch ids, newest first (ids whose batch expired are left out later)."""
        return list(self.redis.zrevrange(keys.batches_of(tenant_digest), 0, -1))

    def job_statuses(self, items: list[BatchItem]) -> dict[str, str]:
        """The status of every job of the batch (missing: expired)."""
        job_ids = [job_id for item in items for job_id in item.job_ids]
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(keys.job(job_id), "status")
        return {
            job_id: str(s or "expired") for job_id, s in zip(job_ids, pipe.execute(), strict=True)
        }
