"""``POST /v1/batches`` as OpenAI's client sends it: ``input_file_id``, ``endpoint``,
``completion_window``, ``metadata``.

The request only checks the request and counts the input's lines (and holds their error
lines' room in the key's file storage, ``web.batches.unread``): the batch is recorded
``validating`` and answered at once, and the batch consumer reads its input into jobs, group by
group (``web.batches.tasks``, ``web.batches.ingest``). A malformed line fails on its own, in
the error file; an input that cannot make a batch at all (no line, more than
``limits.max_batch_requests``) makes a ``failed`` batch with ``errors``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from trickle import keys
from trickle.jobs import BATCH_PRIORITY
from trickle.queue import BROKER_ERRORS, enqueue_batch_task
from web.admission.auth import current_tenant_digest
from web.admission.idempotency import (
    IDEMPOTENCY_HEADER,
    Created,
    IdempotencyKey,
    earlier,
    matching,
    requested_key,
    ttl_seconds,
)
from web.batches.file_store import FileRecord
from web.batches.files import visible_file
from web.batches.lines import BATCH_ENDPOINTS
from web.batches.quota import hold_batch_storage, hold_unread_lines, release_unread_lines
from web.batches.store import BatchRecord, BatchStore, new_batch_id
from web.batches.unread import InputCount, count_file
from web.common.body import parse_json
from web.common.errors import invalid, too_many
from web.services import Services

log = logging.getLogger(__name__)
FIELDS = ("input_file_id", "endpoint", "completion_window", "metadata")
COMPLETION_WINDOWS = ("24h",)
MAX_BATCH_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
INPUT_BACKLOG_RETRY_AFTER_SECONDS = 30


def file_batch_request(raw: bytes) -> dict[str, Any] | None:
    """The body as a file batch's request (one JSON object naming ``input_file_id``); None
    for anything else, which is JSONL input for the route that takes it."""
    if not raw.lstrip().startswith(b"{"):
        return None
    try:
        document = parse_json(raw.decode("utf-8"))
    except ValueError:  # JSON errors, bad UTF-8: JSONL input, judged line by line there
        return None
    if isinstance(document, dict) and "input_file_id" in document:
        return document
    return None


def create_file_batch(svc: Services, store: BatchStore, body: dict[str, Any]) -> BatchRecord:
    input_file_id, endpoint, metadata = _checked(body)
    source = visible_file(svc.files, input_file_id, "input_file_id")
    if source.purpose != "batch":
        raise invalid(
            "input_file_id",
            f"file {input_file_id!r} has purpose {source.purpose!r}; a batch reads 'batch' files",
        )
    key = requested_key(body)
    if key is not None and svc.store.cluster:
        raise invalid(
            IDEMPOTENCY_HEADER, f"{IDEMPOTENCY_HEADER} on /v1/batches needs a single Redis"
        )
    first = earlier(svc, key)
    if first is not None:
        return earlier_batch(store, first.batch_id)
    batch_id = new_batch_id()
    held = hold_batch_storage(svc, store, batch_id, source.bytes, "input_file_id")
    try:
        count = count_file(svc, batch_id, source.id)
        given = Input(batch_id, source, endpoint, count, "input_file_id")
        batch = record_batch(svc, store, key, given, metadata)
    except BaseException:
        held.release(batch_id)
        raise
    if batch.id != batch_id or batch.stage == "failed":  # another request's batch, or none
        held.release(batch_id)  # that keeps lines
    start_reading(svc, batch)
    return batch


@dataclass(frozen=True)
class Input:
    """A new batch's input: the file it reads, its lines (counted, with their unread error
    lines' bound), the request's field that names it, and the urls its lines may name
    (``endpoint``, or for a JSONL body any of ``urls``)."""

    batch_id: str
    source: FileRecord
    endpoint: str
    count: InputCount
    param: str
    urls: tuple[str, ...] | None = None


def record_batch(
    svc: Services,
    store: BatchStore,
    key: IdempotencyKey | None,
    given: Input,
    metadata: dict[str, str] | None,
) -> BatchRecord:
    """The batch's record, ``validating`` with its output room held from the start
    (``hold_unread_lines``), or ``failed`` for an input that cannot make one; with ``key``,
    the batch its first request made (this one's hold released)."""
    now = time.time()
    source, lines = given.source, given.count.lines
    batch = BatchRecord(
        given.batch_id, current_tenant_digest(), now, given.endpoint, 0, stage="validating",
        input_file_id=source.id, metadata=metadata, ingest_offset=0, input_bytes=source.bytes,
        urls=list(given.urls) if given.urls else None,
    )  # fmt: skip
    limit = svc.settings.limits.max_batch_requests
    if lines == 0:
        _fail(batch, now, "empty_file", "the input file has no requests")
    elif lines > limit:
        _fail(batch, now, "too_many_requests", f"{lines} requests; the limit is {limit}")
    else:
        _check_backlog(svc, lines)
        hold_unread_lines(svc, store, batch.id, lines, given.count.unread_bytes, given.param)
    try:
        if key is None:
            store.create(batch, [])
            return batch
        record = Created(key.fingerprint, [], batch.id).to_json()
        found = svc.store.create_once(
            key.redis_key,
            record,
            ttl_seconds(svc),
            lambda pipe: store.queue_create(pipe, batch, []),
        )
    except BaseException:
        release_unread_lines(svc, batch.id)
        raise
    if found is not None:  # a concurrent first request won: its batch
        release_unread_lines(svc, batch.id)
        return earlier_batch(store, matching(key, found).batch_id)
    store.index(batch)
    return batch


def start_reading(svc: Services, batch: BatchRecord) -> None:
    """A ``validating`` batch's reading goes to the batch consumer; its input file is kept
    until the reading ends."""
    if batch.stage != "validating" or batch.input_file_id is None:
        return
    readers = keys.file_readers(batch.input_file_id)
    svc.redis.sadd(readers, batch.id)
    svc.redis.expire(readers, svc.settings.files.retention_seconds)
    try:
        enqueue_batch_task(svc.celery, keys.BATCH_INGEST_TASK, batch.id)
    except BROKER_ERRORS as exc:  # recorded: the next sweep sends its reading
        log.warning("batch %s: its reading waits for the sweep: %s", batch.id, exc)


def _checked(body: dict[str, Any]) -> tuple[str, str, dict[str, str] | None]:
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise invalid(unknown[0], f"unknown field {unknown[0]!r}; a batch takes {list(FIELDS)}")
    input_file_id = body.get("input_file_id")
    if not isinstance(input_file_id, str) or not input_file_id:
        raise invalid("input_file_id", "input_file_id must be a file id (a string)")
    endpoint = body.get("endpoint")
    if endpoint not in BATCH_ENDPOINTS:
        raise invalid("endpoint", f"endpoint must be one of {list(BATCH_ENDPOINTS)}")
    if body.get("completion_window") not in COMPLETION_WINDOWS:
        raise invalid("completion_window", f"completion_window must be one of {COMPLETION_WINDOWS}")
    return input_file_id, str(endpoint), _metadata(body.get("metadata"))


def _metadata(value: Any) -> dict[str, str] | None:
    """OpenAI's metadata: at most 16 string pairs, keys to 64 characters, values to 512."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_BATCH_METADATA_PAIRS:
        raise invalid(
            "metadata", f"metadata must be an object of at most {MAX_BATCH_METADATA_PAIRS} pairs"
        )
    for name, text in value.items():
        if len(name) > MAX_METADATA_KEY or not isinstance(text, str):
            raise invalid(
                f"metadata.{name}", "metadata keys are at most 64 characters, values strings"
            )
        if len(text) > MAX_METADATA_VALUE:
            raise invalid(f"metadata.{name}", "metadata values are at most 512 characters")
    return dict(value)


def _fail(batch: BatchRecord, now: float, code: str, message: str) -> None:
    batch.stage, batch.failed_at = "failed", now
    batch.errors = [{"code": code, "message": message, "param": "input_file_id", "line": None}]


def _check_backlog(svc: Services, adding: int) -> None:
    """A batch is refused while the caller's own batch backlog is full: its batch-priority jobs
    waiting for any served model (lines are read later, so their models are not known yet).
    The 429 names the caller's limit, never the depth of other callers' work."""
    limit = svc.settings.limits.max_batch_backlog
    tenant = svc.tenants.name_of_digest(current_tenant_digest())
    waiting = sum(
        svc.queues.depth(model, tenant, BATCH_PRIORITY) for model in svc.settings.served_models()
    )
    if waiting + adding > limit:
        raise too_many(
            "batch_queue_full",
            f"no room for {adding} more batch jobs of this key "
            f"(limits.max_batch_backlog = {limit} per key); retry later",
            INPUT_BACKLOG_RETRY_AFTER_SECONDS,
        )


def earlier_batch(store: BatchStore, batch_id: str) -> BatchRecord:
    found = store.record(batch_id)
    if found is None:
        raise invalid(IDEMPOTENCY_HEADER, f"the batch of this {IDEMPOTENCY_HEADER} has expired")
    return found
