"""Ending a batch: its output and error files, written once every request has finished.

The batch consumer's settle task (``web.batches.tasks``, sent by each sweep and by a cancel)
writes them once it finds all the batch's requests finished, or its window over, holding a
lease so two tasks never both do; the files appear with the final stage, in one step, so a
task that dies midway leaves the batch to the next one, which writes them anew. The requests'
results outlive ``limits.result_ttl_seconds`` for this (a batch's jobs keep theirs
``files.batch_window_seconds`` longer: ``batch_result_ttl``), and the files then keep them
for ``files.retention_seconds``.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

from trickle import keys
from web.admission.submission import cancel_many
from web.batches.file_store import FileRecord
from web.batches.output import finished_slices, output_line, slices
from web.batches.output_room import OutputRoom, encoded_line, holder_of, settle_holds
from web.batches.store import FINAL_STAGES, BatchRecord, BatchStore
from web.services import Services

FINALIZE_LEASE_SECONDS = 120


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
    """The batch and its requests' states now; a batch found finished is finalized first,
    one still running keeps the counts found in its record (what a read answers with)."""
    # Read again: ``batch`` may have been read before another task finalized it, and a final
    # batch's hold is gone (settling it again would write over what its files took).
    batch = store.record(batch.id) or batch
    if batch.stage in FINAL_STAGES or batch.stage == "validating":
        return batch, Counter()
    tally = settle_holds(svc, store, batch)  # finished lines' holds become what they take
    expired = window_over(svc, batch, time.time())
    if tally["pending"] and not expired:
        store.keep_counts(batch.id, tally["completed"], tally["failed"])
        batch.completed, batch.failed = tally["completed"], tally["failed"]
        return batch, tally
    return finalize(svc, store, batch, expired and tally["pending"] > 0), tally


def finalize(svc: Services, store: BatchStore, batch: BatchRecord, expired: bool) -> BatchRecord:
    """Writes the batch's files and its final stage; returns it ``finalizing`` when another
    process holds the lease (it is doing this now), and as it is when another one finalized
    it already (its files are written once)."""
    lease = keys.batch_finalize(batch.id)
    if not svc.redis.set(lease, "1", nx=True, ex=FINALIZE_LEASE_SECONDS):
        batch.stage = "finalizing"
        return batch
    try:
        latest = store.record(batch.id)
        if latest is None or latest.stage in FINAL_STAGES:
            return latest or batch  # finalized while this task read it, or expired since
        batch = latest
        now = time.time()
        if batch.finalizing_at is None:
            batch.finalizing_at = now
            store.update(batch.id, stage="finalizing", finalizing_at=now)
        if expired and batch.cancelling_at is None:
            batch.expired_at = time.time()  # its unfinished lines fail as batch_expired
            cancel_pending(svc, store, batch)
        written, outputs = _write_files(svc, store, batch)
        if batch.cancelling_at is not None:
            batch.stage, batch.cancelled_at = "cancelled", time.time()
        elif batch.expired_at is not None:
            batch.stage = "expired"
        else:
            batch.stage, batch.completed_at = "completed", time.time()
        batch.output_file_id, batch.error_file_id, batch.completed, batch.failed = outputs
        # The files appear with the final stage, in one step: a task that dies before it
        # leaves no file behind, and the next one writes them anew.
        pipe = svc.files.redis.pipeline(transaction=not svc.store.cluster)
        for record in written:
            svc.files.commit(record, pipe)
        store.update(
            batch.id,
            pipe,
            stage=batch.stage,
            cancelled_at=batch.cancelled_at,
            expired_at=batch.expired_at,
            completed_at=batch.completed_at,
            output_file_id=batch.output_file_id,
            error_file_id=batch.error_file_id,
            completed=batch.completed,
            failed=batch.failed,
        )
        store.settled(batch.id, pipe)
        OutputRoom(svc, batch).drop(pipe)  # the files hold their bytes now
        pipe.execute()
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
) -> tuple[list[FileRecord], tuple[str | None, str | None, int, int]]:
    """The output file (requests that succeeded) and the error file (the rest), in input
    order; a file with no line is not made. Returns their records (written, not committed)
    and their ids and line counts."""
    files = svc.files
    # Counted against the tenant's storage (a batch's output may be thousands of times its
    # input), never refused: the requests ran, their results are kept whole. The batch held
    # their room while its lines ran (web/batches/output_room.py): each piece the files hold
    # moves over from the batch's hold in the same script call, so nobody takes it between.
    output, errors = (
        files.writer(
            batch.tenant_digest, _filename(batch, name), sys.maxsize, enforce=False,
            drawing_from=holder_of(batch.id),
        )
        for name in ("output", "error")
    )  # fmt: skip
    written = {id(output): 0, id(errors): 0}
    for index, item, state, jobs in finished_slices(svc, store, batch):
        line = output_line(svc, batch, index, item, state, jobs)
        target = output if line["error"] is None else errors
        target.write(encoded_line(line))
        written[id(target)] += 1
    records: list[FileRecord] = []
    ids: list[str | None] = []
    for writer, name in ((output, "output"), (errors, "error")):
        if written[id(writer)]:
            writer.finish()
            records.append(
                files.record_for(
                    writer, batch.tenant_digest, _filename(batch, name), "batch_output"
                )
            )
            ids.append(writer.file_id)
        else:
            writer.discard()
            ids.append(None)
    return records, (ids[0], ids[1], written[id(output)], written[id(errors)])


def _filename(batch: BatchRecord, name: str) -> str:
    return f"{batch.id}_{name}.jsonl"
