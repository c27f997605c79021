"""A batch's progress and its output lines, read from its jobs a slice of items at a time.

A batch of 10,000 lines is never held whole: its items are read ``SLICE`` at a time, with the
statuses of their jobs in one round trip per slice.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

from trickle.jobs import Job, JobStatus
from web.batches.lines import result_body
from web.batches.store import BatchItem, BatchRecord, BatchStore
from web.services import Services

# A failed job's error as its line writes it: cut, so a line's output hold can bound it.
FAILURE_MESSAGE_CHARS = 200
FAILURE_CODE_CHARS = 64
# Small: a read in a web process (a batch's counts) yields to its other requests between
# slices, so no request waits longer than one slice's parsing behind a poll of a large batch.
SLICE = 100


def item_state(item: BatchItem, statuses: dict[str, str]) -> str:
    """pending | completed | failed for one request."""
    if item.error is not None:
        return "failed"
    states = [statuses.get(job_id, "expired") for job_id in item.job_ids]
    if any(s in ("queued", "running") for s in states):
        return "pending"
    return "completed" if all(s == JobStatus.SUCCEEDED.value for s in states) else "failed"


def slices(store: BatchStore, batch: BatchRecord) -> Iterator[tuple[int, BatchItem, str]]:
    """(index, item, state) for every item, in input order, a slice per round trip, yielding
    to the event loop between slices."""
    start = 0
    while True:
        items = store.items(batch.id, start, SLICE)
        if not items:
            return
        statuses = store.job_statuses(items)
        for offset, item in enumerate(items):
            yield start + offset, item, item_state(item, statuses)
        start += len(items)
        time.sleep(0)  # under gevent: let other requests run between slices


def finished_slices(
    svc: Services, store: BatchStore, batch: BatchRecord
) -> Iterator[tuple[int, BatchItem, str, list[Job]]]:
    """``slices`` with each finished item's jobs, read in one round trip per slice."""
    entries = slices(store, batch)
    while group := list(itertools.islice(entries, SLICE)):
        wanted = [
            job_id for _index, item, state in group if state != "pending" for job_id in item.job_ids
        ]
        found = dict(zip(wanted, svc.store.finished_many(wanted), strict=True))
        for index, item, state in group:
            jobs = [job for job_id in item.job_ids if (job := found.get(job_id)) is not None]
            yield index, item, state, jobs


def output_line(
    svc: Services, batch: BatchRecord, index: int, item: BatchItem, state: str, jobs: list[Job]
) -> dict[str, Any]:
    """OpenAI's output line for a finished item (``state`` not pending), from its finished
    ``jobs`` (``finished_slices``)."""
    line: dict[str, Any] = {"id": f"{batch.id}_req_{index}", "custom_id": item.custom_id or None}
    if item.error is not None:
        line["response"] = {"status_code": item.error_status, "body": {"error": item.error}}
        line["error"] = {
            "code": item.error.get("code") or item.error["type"],
            "message": item.error["message"],
        }
        return line
    if state == "completed" and len(jobs) == len(item.job_ids):
        body = result_body(svc, item, int(batch.created_at), jobs)
        line["response"] = {"status_code": 200, "request_id": item.job_ids[0], "body": body}
        line["error"] = None
        return line
    line["response"] = None
    line["error"] = _failure(jobs, batch)
    return line


def _failure(jobs: list[Job], batch: BatchRecord) -> dict[str, str]:
    for job in jobs:
        if job.status is JobStatus.FAILED and job.error is not None:
            message = job.error.message
            if len(message) > FAILURE_MESSAGE_CHARS:
                message = message[:FAILURE_MESSAGE_CHARS] + "..."
            return {"code": job.error.type[:FAILURE_CODE_CHARS], "message": message}
    if batch.cancelling_at is not None:
        return {"code": "batch_cancelled", "message": "the batch was cancelled first"}
    if batch.expired_at is not None:
        return {"code": "batch_expired", "message": "the batch's completion window ended first"}
    return {"code": "not_completed", "message": "the request's jobs were canceled or expired"}
