"""The batch object OpenAI's clients parse, from a batch's record."""

from __future__ import annotations

from typing import cast

from web.batches.store import BatchRecord, BatchStore
from web.common.response_models import Batch, BatchErrors, BatchStatus, Queued
from web.services import Services
from web.streams.routes import queued_object

# Items read past a batch's finished ones to find its next queued job.
NEXT_START_ITEMS = 64


def batch_object(svc: Services, batch: BatchRecord) -> Batch:
    """The batch as its record tells it: its counts are those its tasks last wrote (a final
    batch's are its files' lines), so a read makes no other round trip, and writes nothing
    (the batch consumer reads its input, keeps its counts and writes its files)."""
    completed, failed = batch.completed or 0, batch.failed or 0
    status = cast(BatchStatus, batch.stage)
    if batch.cancelling_at is not None and status in ("validating", "in_progress"):
        status = "cancelling"
    window = svc.settings.files.batch_window_seconds
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": cast(BatchErrors, {"object": "list", "data": batch.errors})
        if batch.errors
        else None,
        "input_file_id": batch.input_file_id,
        "completion_window": "24h",
        "status": status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at),
        "in_progress_at": _seconds(batch.in_progress_at),
        "expires_at": int(batch.created_at + window),
        "finalizing_at": _seconds(batch.finalizing_at),
        "completed_at": _seconds(batch.completed_at),
        "failed_at": _seconds(batch.failed_at),
        "expired_at": _seconds(batch.expired_at),
        "cancelling_at": _seconds(batch.cancelling_at),
        "cancelled_at": _seconds(batch.cancelled_at),
        "request_counts": {"total": batch.total, "completed": completed, "failed": failed},
        "metadata": batch.metadata,
        "output_url": f"/v1/batches/{batch.id}/output",
    }


def next_start(svc: Services, store: BatchStore, batch: Batch) -> Queued | None:
    """Where the batch's next job to start stands while its requests wait for a worker: the
    first of the ``NEXT_START_ITEMS`` items after those finished that is still queued (jobs
    are taken about in their lines' order)."""
    counts = batch["request_counts"]
    done = counts["completed"] + counts["failed"]
    if batch["status"] != "in_progress" or done >= counts["total"]:
        return None
    items = store.items(batch["id"], done, NEXT_START_ITEMS)
    found = svc.waiting.first_of(job_id for item in items for job_id in item.job_ids)
    return None if found is None else queued_object(found.position, found.eta_seconds)


def _seconds(moment: float | None) -> int | None:
    return None if moment is None else int(moment)
