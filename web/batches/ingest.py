"""Reading a batch's input file (uploaded, or a JSONL body stored as one) into jobs,
``INGEST_LINES`` lines at a time, in the batch consumer's ingest task (``web.batches.tasks``).

The input file is read a chunk at a time; each group of lines' jobs are recorded, then its
items and how far the input has been read are written in one script, only if the recorded
offset is still the one this reading started the group from (``BatchStore.append_group``), then
the jobs are sent to the queues: a 10,000-line batch never sits whole in memory. A lease
(renewed every group) names the task reading; if its process dies, the lease lapses and the
next sweep (or the task's redelivery) resumes from the offset recorded with the last group.
A reading too slow to renew its lease in time may meet the one that resumed it: the offset
check lets one of them write each group, the other takes its jobs back and stops, so every line
becomes jobs exactly once.

A named key's ``max_queued_jobs`` makes lines wait, not fail: the reading pauses before the
first line whose jobs find no place in the key's batch queue (``KeyRoom``), the batch stays
``validating`` with its offset, and a later sweep resumes it once the workers have taken jobs.
The key's file storage does the same: each line's output is held before its jobs are sent
(``web.batches.output_room``), in place of its unread error line's hold taken when the batch
was made (``web.batches.unread``), and a line whose hold does not fit yet waits for room. A wait
that cannot end (room no settling can give back, or the batch's window over) ends the batch:
its unread lines fail (``web.batches.unread``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from trickle import keys
from trickle.jobs import Job
from web.admission.auth import current_key
from web.admission.key_policy import check_key_policy
from web.admission.submission import admission_cost, enqueue_many
from web.batches.file_store import line_groups
from web.batches.finalize import batch_result_ttl, cancel_pending, finalize, window_over
from web.batches.key_room import KeyRoom
from web.batches.lines import check_line_size, failed_item, jobs_for_item, parse_line
from web.batches.output_room import (
    OUTPUT_HOLDER_SUFFIX,
    OutputRoom,
    check_projection,
    holder_of,
    line_bound,
    output_quota,
    refused_line_bytes,
    settle_holds,
)
from web.batches.store import BatchItem, BatchRecord, BatchStore
from web.batches.unread import (
    fail_unread,
    storage_full_error,
    unread_custom_id,
    unread_line_base,
    unread_line_bound,
    window_ended_error,
)
from web.common.body import decode_utf8
from web.common.errors import HttpError
from web.services import Services

INGEST_LINES = 200
# A group takes well under a second: a reading whose process died resumes this much later.
INGEST_LEASE_SECONDS = 10
# Why a reading paused at a line: the key's file storage, or its queue, has no room for it yet.
WAITING_FOR_ROOM = "file storage"
WAITING_FOR_QUEUE = "queue"


class ReadingTaken(Exception):
    """Another reading of the batch wrote the group this one was about to write."""


@dataclass
class Reading:
    """How far a reading has come: what the batch's record holds after its last group."""

    offset: int  # input bytes read into items
    number: int  # lines read (the batch's total)
    jobs_made: int = 0
    seen: set[str] = field(default_factory=set)  # custom_ids read
    urls: set[str] = field(default_factory=set)  # of the lines that made jobs


def ingest(svc: Services, store: BatchStore, batch: BatchRecord) -> BatchRecord:
    """Reads the rest of the batch's input into jobs unless another task is at it; the
    batch is ``in_progress`` once the whole input is read."""
    lease = keys.batch_ingest(batch.id)
    if not svc.redis.set(lease, "1", nx=True, ex=INGEST_LEASE_SECONDS):
        return batch
    try:
        latest = store.record(batch.id) or batch  # a resumed read starts where the last stopped
        if latest.stage == "validating":
            _ingest(svc, store, latest, lease)
    except ReadingTaken:  # a slow reading met the one that resumed it: that one goes on
        return store.record(batch.id) or batch
    finally:
        svc.redis.delete(lease)
    return store.record(batch.id) or latest


def _ingest(svc: Services, store: BatchStore, batch: BatchRecord, lease: str) -> None:
    if batch.cancelling_at is not None:  # cancelled before its reading began (or resumed)
        cancel_pending(svc, store, batch)
        _read(svc, batch)
        store.update(batch.id, stage="in_progress", in_progress_at=time.time())
        return
    reading = _read_so_far(store, batch)
    if reading.number:  # resumed: the lines read so far that finished give their room back
        settle_holds(svc, store, batch)
    if window_over(svc, batch, time.time()):  # it runs nothing more: the rest fails
        _end_unread(svc, store, batch, reading, window_ended_error(), expired=True)
        return
    stalled = keys.batch_room_stalled(batch.id)
    while True:
        number = reading.number
        # Cleared before it reads: lines it starts now will give room back, and a batch that
        # looks meanwhile must count on them.
        svc.redis.delete(stalled)
        if _read_input(svc, store, batch, lease, reading) != WAITING_FOR_ROOM:
            return
        tally = settle_holds(svc, store, batch)
        if tally["pending"]:
            return  # room comes back as those lines finish: the sweep resumes it then
        # Marked before it looks at the others: of two that look at once, one sees the other.
        svc.redis.set(stalled, "1", ex=_stall_mark_seconds(svc))
        if _room_may_come(svc, batch):
            return
        if reading.number == number and not tally["given_back"]:
            break  # nothing read, nothing given back: no room will come but the client's
    svc.redis.delete(stalled)
    _end_unread(svc, store, batch, reading, storage_full_error(svc, number + 1), expired=False)


def _stall_mark_seconds(svc: Services) -> int:
    """A stalled mark outlives a few of the sweep's resumptions, which renew it."""
    return max(int(4 * svc.settings.files.batch_sweep_seconds), 10)


def _read_input(
    svc: Services, store: BatchStore, batch: BatchRecord, lease: str, reading: Reading
) -> str | None:
    """Reads the input on from ``reading`` until its end (the batch is then ``in_progress``)
    or a line that must wait (``WAITING_FOR_ROOM`` or ``WAITING_FOR_QUEUE``, returned)."""
    assert batch.input_file_id is not None
    chunks = svc.files.chunks(batch.input_file_id)
    max_line = svc.settings.web.max_body_bytes
    groups = line_groups(chunks, reading.offset, max_line, INGEST_LINES)
    for read_to, group in groups:  # noqa: B007 (its last value: how far the input was read)
        if group and (waiting := _write_group(svc, store, batch, group, reading)):
            return waiting  # the rest waits (module docstring)
        if len(group) < INGEST_LINES:
            break  # the input's end
        svc.redis.expire(lease, INGEST_LEASE_SECONDS)
        latest = store.record(batch.id)
        if latest is None:  # the batch expired meanwhile
            return None
        if latest.cancelling_at is not None:  # cancelled: the rest is never read, and
            cancel_pending(svc, store, latest)  # the group written meanwhile is stopped
            _read(svc, batch)
            store.update(batch.id, stage="in_progress", in_progress_at=time.time())
            return None
    _read(svc, batch)
    if read_to < (batch.input_bytes or 0):  # the input went (deleted, expired) mid-read
        _fail_cut_short(svc, store, batch, read_to)
        return None
    if batch.urls and reading.urls:  # a JSONL body's lines may mix endpoints
        endpoint = reading.urls.pop() if len(reading.urls) == 1 else "mixed"
        store.update(batch.id, endpoint=endpoint)
    store.update(batch.id, stage="in_progress", in_progress_at=time.time())
    return None


def _room_may_come(svc: Services, batch: BatchRecord) -> bool:
    """Whether room may come back within the batch's window without the client: another batch
    of the key holds output room and runs or reads on (its settling may give some back), or
    one of the key's holds (a stored file, at its expiry; an upload in progress) lapses before
    the window ends. Another batch that waits for room itself, none of its lines running,
    holds only what its finished lines wrote, which its files keep: it gives none back, so two
    such batches no longer wait on each other until their windows end."""
    own = holder_of(batch.id)
    window_ends = batch.created_at + svc.settings.files.batch_window_seconds
    lapses = output_quota(svc, batch.tenant_digest).lapse_times()
    others = {holder: at for holder, at in lapses.items() if holder != own}
    if any(at < window_ends for at in others.values()):
        return True
    marks = [keys.batch_room_stalled(holder.removesuffix(OUTPUT_HOLDER_SUFFIX))
             for holder in others if holder.endswith(OUTPUT_HOLDER_SUFFIX)]  # fmt: skip
    return bool(marks) and svc.redis.exists(*marks) < len(marks)  # one of them not stalled


def _end_unread(
    svc: Services,
    store: BatchStore,
    batch: BatchRecord,
    reading: Reading,
    error: HttpError,
    expired: bool,
) -> None:
    """The lines not read fail with ``error`` (``web.batches.unread``), then the batch
    finalizes (``expired``: its window ended, its running lines fail ``batch_expired``)."""
    if not fail_unread(svc, store, batch, (reading.offset, reading.number), error):
        raise ReadingTaken(batch.id)
    _read(svc, batch)
    latest = store.record(batch.id)
    if latest is not None and (latest.ingest_offset or 0) < (batch.input_bytes or 0):
        _fail_cut_short(svc, store, latest, latest.ingest_offset or 0)  # the input went
        return
    store.update(batch.id, stage="in_progress", in_progress_at=time.time())
    latest = store.record(batch.id)
    if latest is not None:
        finalize(svc, store, latest, expired)


def _read(svc: Services, batch: BatchRecord) -> None:
    """The batch no longer reads its input file: the file may be deleted."""
    assert batch.input_file_id is not None
    svc.redis.srem(keys.file_readers(batch.input_file_id), batch.id)


def _fail_cut_short(svc: Services, store: BatchStore, batch: BatchRecord, read_to: int) -> None:
    """The input file ended before its size: the batch fails, naming why, and the jobs of its
    lines read so far stop (never a batch that ends ``completed`` with part of its input)."""
    latest = store.record(batch.id) or batch
    cancel_pending(svc, store, latest)
    now = time.time()
    error = {
        "code": "input_file_unavailable",
        "message": f"the input file {batch.input_file_id} was deleted or expired while it was "
        f"read, after {read_to} of its {batch.input_bytes} bytes",
        "param": "input_file_id",
        "line": None,
    }
    store.update(batch.id, stage="failed", failed_at=now, errors=[error])
    OutputRoom(svc, batch).drop()  # no output file is written


def _read_so_far(store: BatchStore, batch: BatchRecord) -> Reading:
    """Where the batch's reading stands (a resumed read goes on from there)."""
    reading = Reading(batch.ingest_offset or 0, batch.total)
    start = 0
    while start < batch.total:
        items = store.items(batch.id, start, 1000)
        if not items:
            break
        reading.seen.update(item.custom_id for item in items if item.custom_id)
        reading.urls.update(item.url for item in items if item.error is None)
        reading.jobs_made += sum(len(item.job_ids) for item in items)
        start += len(items)
    return reading


def _write_group(
    svc: Services,
    store: BatchStore,
    batch: BatchRecord,
    group: list[tuple[int, bytes]],
    reading: Reading,
) -> str | None:
    """One group of lines: its jobs recorded, then its items and the new offset if no other
    reading wrote this group first (else its jobs are taken back: ``ReadingTaken``), then the
    jobs to the queues; ``reading`` moves on. Returns why the reading paused at a line (the
    key's file storage or queue has no room for it yet: it is read again on resuming), if it
    did."""
    items: list[BatchItem] = []
    jobs: list[Job] = []
    room = KeyRoom(svc, current_key())
    output = OutputRoom(svc, batch)
    number, offset = reading.number, reading.offset
    paused: str | None = None
    parsed = _parse_group(svc, batch, group, reading)
    # Each line holds its unread error line since the batch was made: it takes what its
    # output needs besides; what it needs less is given back once it is recorded.
    extra = [item.output_hold - reserved for _end, item, _jobs, reserved in parsed]
    holds = [max(0, more) for more in extra]
    whole = output.take(sum(holds))  # one script call for the group when it all fits
    try:
        for (end, item, item_jobs, _reserved), holding in zip(parsed, holds, strict=True):
            if not whole and not output.take(holding):
                paused = WAITING_FOR_ROOM
                break
            if not room.take(item_jobs):
                output.give_back(0 if whole else holding)
                paused = WAITING_FOR_QUEUE
                break
            number += 1
            offset = end
            items.append(item)
            jobs += item_jobs
        if whole:  # the lines left for a later reading hold nothing meanwhile
            output.give_back(sum(holds[len(items) :]))
        if not items:
            return paused
        if jobs:
            try:
                svc.rate_limiter.admit(admission_cost(jobs))
            except HttpError as exc:  # over the key's tokens per minute: this group fails
                for index, item in enumerate(items, reading.number):
                    if item.job_ids:
                        _refuse(item, exc)
                        held, item.output_hold = (
                            item.output_hold,
                            refused_line_bytes(svc, batch, index, item),
                        )
                        output.give_back(held - item.output_hold)
                jobs = []

        svc.store.create_many(jobs)  # first: an item never names a job that does not exist
        if not store.append_group(batch.id, items, reading.offset, offset, number):
            svc.store.delete_unpublished([job.id for job in jobs])
            raise ReadingTaken(batch.id)
        output.keep()  # the lines are recorded: their holds are the batch's now
        output.give_back(-sum(min(0, less) for less in extra[: len(items)]))
        if jobs:
            enqueue_many(svc, jobs, recorded=True, on_sent=room.hand_over())
    finally:
        room.release()  # a no-op once the fan-out owns the places
        output.release()  # a no-op once the lines are recorded
    reading.number, reading.offset = number, offset
    reading.seen.update(item.custom_id for item in items if item.custom_id)
    reading.jobs_made += len(jobs)
    reading.urls.update(item.url for item in items if item.error is None)
    return paused


def _parse_group(
    svc: Services, batch: BatchRecord, group: list[tuple[int, bytes]], reading: Reading
) -> list[tuple[int, BatchItem, list[Job], int]]:
    """The group's lines as items with their jobs, numbered and checked (custom_ids, the
    batch's job count) as if each of them were read, and what each held until now (its
    unread error line's bound); ``reading`` learns only of those that are recorded
    (``_write_group``), so a line read again after a pause is not a repeat."""
    seen = set(reading.seen)
    made = reading.jobs_made
    base = unread_line_base(svc, batch.id)
    parsed: list[tuple[int, BatchItem, list[Job], int]] = []
    for end, raw in group:
        item, item_jobs = _item(svc, batch, reading.number + len(parsed) + 1, raw, seen, made)
        made += len(item_jobs)
        parsed.append((end, item, item_jobs, unread_line_bound(base, unread_custom_id(raw))))
    return parsed


def _item(
    svc: Services, batch: BatchRecord, number: int, raw: bytes, seen: set[str], jobs_made: int
) -> tuple[BatchItem, list[Job]]:
    """A line as an item with its jobs, or with the error it fails with on its own."""
    limits = svc.settings.limits
    custom_id = ""
    try:
        check_line_size(number, len(raw), svc.settings.web.max_body_bytes)
        text = decode_utf8(raw, f"line {number}", f"line {number}")
        item = parse_line(number, text, tuple(batch.urls or (batch.endpoint,)))
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
        check_key_policy(svc, current_key(), jobs, queue_cap=False)  # KeyRoom waits instead
        projected = line_bound(svc, item, jobs)
        check_projection(svc, number, projected)
    except HttpError as exc:
        failed = failed_item(custom_id, batch.endpoint, exc)
        failed.output_hold = refused_line_bytes(svc, batch, number - 1, failed)
        return failed, []
    item.job_ids = [job.id for job in jobs]
    item.output_hold = projected
    return item, jobs


def _refuse(item: BatchItem, error: HttpError) -> None:
    item.refuse(error.status, error.to_dict()["error"])
