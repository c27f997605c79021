"""Reading a file batch's input into jobs, ``INGEST_LINES`` lines at a time.

The input file is read a chunk at a time and each group of lines is written in one transaction
(its jobs, its items, and how far the input has been read), then sent to the queues, then the
event loop gets a turn: a 10,000-line batch never sits whole in a web process, and never holds
its other requests for longer than one group. A lease names the process reading; if that
process dies, the next read of the batch finds the lease gone and resumes from the offset
recorded with the last group, so every line becomes jobs exactly once.
"""

from __future__ import annotations

import json
import time
from typing import Any

from trickle import keys
from trickle.jobs import Job
from web.admission.auth import current_key
from web.admission.key_policy import check_key_policy
from web.admission.submission import admission_cost, enqueue_many
from web.batches.file_store import lines_of
from web.batches.finalize import batch_result_ttl, cancel_pending
from web.batches.lines import failed_item, jobs_for_item, parse_line
from web.batches.store import BatchItem, BatchRecord, BatchStore
from web.common.body import decode_utf8
from web.common.errors import HttpError
from web.services import Services

INGEST_LINES = 200
INGEST_LEASE_SECONDS = 30
# Lines between two turns of the event loop, inside a group.
YIELD_EVERY = 25


def count_lines(svc: Services, file_id: str) -> int:
    """Non-blank lines of a stored file, read a chunk at a time."""
    return sum(1 for _end, line in lines_of(svc.files.chunks(file_id)) if line.strip())


def ingest(svc: Services, store: BatchStore, batch: BatchRecord) -> BatchRecord:
    """Reads the rest of the batch's input into jobs unless another process is at it; the
    batch is ``in_progress`` once the whole input is read."""
    lease = keys.batch_ingest(batch.id)
    if not svc.redis.set(lease, "1", nx=True, ex=INGEST_LEASE_SECONDS):
        return batch
    try:
        latest = store.record(batch.id) or batch  # a resumed read starts where the last stopped
        if latest.stage == "validating":
            _ingest(svc, store, latest, lease)
        return store.record(batch.id) or latest
    finally:
        svc.redis.delete(lease)


def _ingest(svc: Services, store: BatchStore, batch: BatchRecord, lease: str) -> None:
    seen, jobs_made = _read_so_far(store, batch)
    offset = batch.ingest_offset or 0
    number = batch.total
    group: list[tuple[int, bytes]] = []
    assert batch.input_file_id is not None
    for end, line in lines_of(svc.files.chunks(batch.input_file_id), offset):
        if line.strip():
            group.append((end, line))
        if len(group) == INGEST_LINES:
            number, jobs_made = _write_group(svc, store, batch, group, number, seen, jobs_made)
            svc.redis.expire(lease, INGEST_LEASE_SECONDS)
            group = []
            time.sleep(0)  # under gevent: the process's other requests run between groups
            latest = store.record(batch.id)
            if latest is None:  # the batch expired meanwhile
                return
            if latest.cancelling_at is not None:  # cancelled: the rest is never read, and
                cancel_pending(svc, store, latest)  # the group written meanwhile is stopped
                group = []
                break
    if group:
        _write_group(svc, store, batch, group, number, seen, jobs_made)
    store.update(batch.id, stage="in_progress", in_progress_at=time.time())


def _read_so_far(store: BatchStore, batch: BatchRecord) -> tuple[set[str], int]:
    """The custom_ids and job count of the items already read (a resumed read goes on)."""
    seen: set[str] = set()
    jobs = 0
    start = 0
    while start < batch.total:
        items = store.items(batch.id, start, 1000)
        if not items:
            break
        seen.update(item.custom_id for item in items if item.custom_id)
        jobs += sum(len(item.job_ids) for item in items)
        start += len(items)
    return seen, jobs


def _write_group(
    svc: Services,
    store: BatchStore,
    batch: BatchRecord,
    group: list[tuple[int, bytes]],
    number: int,
    seen: set[str],
    jobs_made: int,
) -> tuple[int, int]:
    """One group of lines: its jobs, its items and the new offset in one transaction, then
    the jobs to the queues. Returns the lines and jobs read so far."""
    items: list[BatchItem] = []
    jobs: list[Job] = []
    for _end, raw in group:
        number += 1
        item, item_jobs = _item(svc, batch, number, raw, seen, jobs_made + len(jobs))
        items.append(item)
        jobs += item_jobs
        if number % YIELD_EVERY == 0:
            time.sleep(0)  # a line costs a parse, a template and a tokenization: take turns
    if jobs:
        try:
            svc.rate_limiter.admit(admission_cost(jobs))
        except HttpError as exc:  # over the key's tokens per minute: this group fails
            for item in items:
                if item.job_ids:
                    _refuse(item, exc)
            jobs = []
    offset = group[-1][0]

    def writes(pipe: Any) -> None:
        pipe.rpush(keys.batch_items(batch.id), *[json.dumps(item.to_dict()) for item in items])
        store.update(batch.id, pipe, total=number, ingest_offset=offset)

    svc.store.create_many(jobs, also=writes)
    if jobs:
        enqueue_many(svc, jobs, recorded=True)
    return number, jobs_made + len(jobs)


def _item(
    svc: Services, batch: BatchRecord, number: int, raw: bytes, seen: set[str], jobs_made: int
) -> tuple[BatchItem, list[Job]]:
    """A line as an item with its jobs, or with the error it fails with on its own."""
    limits = svc.settings.limits
    custom_id = ""
    try:
        text = decode_utf8(raw, f"line {number}", f"line {number}")
        item = parse_line(number, text, (batch.endpoint,))
        custom_id = item.custom_id
        if custom_id in seen:
            raise HttpError(
                400, "invalid_request_error", f"custom_id {custom_id!r} is repeated",
                f"line {number}.custom_id", code="duplicate_custom_id",
            )  # fmt: skip
        seen.add(custom_id)
        jobs = jobs_for_item(svc, item, batch_result_ttl(svc))
        if jobs_made + len(jobs) > limits.max_batch_jobs:
            raise HttpError(
                400, "invalid_request_error",
                f"the batch would make more than {limits.max_batch_jobs} jobs "
                "(limits.max_batch_jobs)", f"line {number}", code="batch_job_limit",
            )  # fmt: skip
        check_key_policy(svc, current_key(), jobs)
    except HttpError as exc:
        return failed_item(custom_id, batch.endpoint, exc), []
    item.job_ids = [job.id for job in jobs]
    return item, jobs


def _refuse(item: BatchItem, error: HttpError) -> None:
    item.refuse(error.status, error.to_dict()["error"])
