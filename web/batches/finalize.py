"""Ending a batch: its output and error files, written once every request has finished.

Each web process's sweeper (``web.batches.sweeper``) settles batches that are due, and so does
the first read of one (``GET /v1/batches/<id>``, the list) that finds all its requests
finished, or its window over: whichever comes first writes the files, holding a lease so two
never both do. The requests' results outlive ``limits.result_ttl_seconds`` for this
(a batch's jobs keep theirs ``files.batch_window_seconds`` longer: ``batch_result_ttl``), and
the files then keep them for ``files.retention_seconds``.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter

from trickle import keys
from web.admission.submission import cancel_many
from web.batches.file_store import FileWriter
from web.batches.output import counts, finished_slices, output_line, slices
from web.batches.store import FINAL_STAGES, BatchRecord, BatchStore
from web.services import Services

FINALIZE_LEASE_SECONDS = 120
# Lines between two turns of the event loop while the files are written.
YIELD_EVERY = 25


def batch_result_ttl(svc: Services) -> int:
    """How long a batch's job keeps its result: the batch's window, plus the interactive
    result time, so a request that ends just before the window closes is still there for
    the read that writes the files after it."""
    return svc.settings.files.batch_window_seconds + svc.settings.limits.result_ttl_seconds


def batch_store(svc: Services) -> BatchStore:
    """A batch lives while its jobs may wait queued and then keep their results."""
    ttl = svc.settings.limits.queued_ttl_seconds + batch_result_ttl(svc)
    return BatchStore(svc.redis, ttl)


def window_over(svc: Services, batch: BatchRecord, now: float) -> bool:
    return now >= batch.created_at + svc.settings.files.batch_window_seconds


def settle(
    svc: Services, store: BatchStore, batch: BatchRecord
) -> tuple[BatchRecord, Counter[str]]:
    """The batch and its requests' states now; a batch found finished is finalized first."""
    if batch.stage in FINAL_STAGES or batch.stage == "validating":
        return batch, Counter()
    tally = counts(store, batch)
    expired = window_over(svc, batch, time.time())
    if tally["pending"] and not expired:
        return batch, tally
    return finalize(svc, store, batch, expired and tally["pending"] > 0), tally


def finalize(svc: Services, store: BatchStore, batch: BatchRecord, expired: bool) -> BatchRecord:
    """Writes the batch's files and its final stage; returns it ``finalizing`` when another
    process holds the lease (it is doing this now)."""
    lease = keys.batch_finalize(batch.id)
    if not svc.redis.set(lease, "1", nx=True, ex=FINALIZE_LEASE_SECONDS):
        batch.stage = "finalizing"
        return batch
    try:
        now = time.time()
        if batch.finalizing_at is None:
            batch.finalizing_at = now
            store.update(batch.id, stage="finalizing", finalizing_at=now)
        if expired and batch.cancelling_at is None:
            batch.expired_at = time.time()  # its unfinished lines fail as batch_expired
            cancel_pending(svc, store, batch)
        outputs = _write_files(svc, store, batch)
        if batch.cancelling_at is not None:
            batch.stage, batch.cancelled_at = "cancelled", time.time()
        elif batch.expired_at is not None:
            batch.stage = "expired"
        else:
            batch.stage, batch.completed_at = "completed", time.time()
        batch.output_file_id, batch.error_file_id, batch.completed, batch.failed = outputs
        store.update(
            batch.id,
            stage=batch.stage,
            cancelled_at=batch.cancelled_at,
            expired_at=batch.expired_at,
            completed_at=batch.completed_at,
            output_file_id=batch.output_file_id,
            error_file_id=batch.error_file_id,
            completed=batch.completed,
            failed=batch.failed,
        )
        store.settled(batch.id)
    finally:
        svc.redis.delete(lease)
    return batch


def cancel_pending(svc: Services, store: BatchStore, batch: BatchRecord) -> None:
    """Cancels every job of the batch not finished yet (cancelled, or past its window)."""
    pending: list[tuple[str, str]] = []
    for _index, item, state in slices(store, batch):
        if state == "pending":
            model = str(item.body.get("model", svc.settings.default_model))
            pending += [(job_id, model) for job_id in item.job_ids]
    if pending:
        cancel_many(svc, pending)


def _write_files(
    svc: Services, store: BatchStore, batch: BatchRecord
) -> tuple[str | None, str | None, int, int]:
    """The output file (requests that succeeded) and the error file (the rest), in input
    order; a file with no line is not made. Returns their ids and line counts."""
    files = svc.files
    output, errors = files.writer(sys.maxsize), files.writer(sys.maxsize)
    written = {id(output): 0, id(errors): 0}
    for index, item, state, jobs in finished_slices(svc, store, batch):
        line = output_line(svc, batch, index, item, state, jobs)
        target = output if line["error"] is None else errors
        target.write((json.dumps(line, ensure_ascii=False) + "\n").encode())
        written[id(target)] += 1
        if index % YIELD_EVERY == 0:
            time.sleep(0)  # each line is parsed again to render its body: take turns
    ids: list[str | None] = []
    for writer, name in ((output, "output"), (errors, "error")):
        ids.append(_keep(svc, batch, writer, name) if written[id(writer)] else None)
        if not written[id(writer)]:
            writer.discard()
    return ids[0], ids[1], written[id(output)], written[id(errors)]


def _keep(svc: Services, batch: BatchRecord, writer: FileWriter, name: str) -> str:
    writer.finish()
    files = svc.files
    filename = f"{batch.id}_{name}.jsonl"
    files.commit(files.record_for(writer, batch.owner, filename, "batch_output"))
    return writer.file_id
