"""A key's batch storage: the input its live batches hold in Redis, bounded per key.

A batch keeps every line (its body included) in its items list until the batch expires, for
its output file, besides its input file (uploaded, or its JSONL body stored). Without a bound, one
key could pin Redis memory with batch after batch, whatever the job backlog allows (a line may
be refused, or make one short job, and still be stored). A batch's input bytes (the JSONL body,
or its input file's size) are held under its id before it is recorded, until it expires;
``limits.max_batch_input_bytes_per_key`` bounds their sum per key (the anonymous callers share
one). The hold is taken by one script (``trickle.store.held_quota``), so two batches created at
the same moment cannot both take the last room.
"""

from __future__ import annotations

import math
import sys
import time

from trickle import keys
from trickle.store.held_quota import HeldQuota, QuotaFull
from web.admission.auth import current_tenant_digest
from web.batches.output_room import files_overhead, holder_of, output_quota
from web.batches.store import BatchStore
from web.common.errors import HttpError
from web.services import Services

QUOTA_CODE = "batch_storage_full"


def batch_inputs(svc: Services, tenant_digest: str) -> HeldQuota:
    """The tenant's batch-input holds (no bound on their count: the job backlog is one)."""
    return HeldQuota(
        svc.redis,
        keys.batch_inputs_held(tenant_digest),
        keys.batch_inputs_held_bytes(tenant_digest),
        svc.settings.limits.max_batch_input_bytes_per_key,
        sys.maxsize,
    )


def hold_batch_storage(
    svc: Services, store: BatchStore, batch_id: str, adding: int, param: str
) -> HeldQuota:
    """Hold ``adding`` bytes for the batch ``batch_id`` until it expires, or refuse (429 naming
    ``param``) a batch whose input would take the caller's live batches past the limit; the
    message tells the caller's own figures only. The caller releases the hold should the
    batch not be made."""
    check_output_room(svc, param)
    limit = svc.settings.limits.max_batch_input_bytes_per_key
    quota = batch_inputs(svc, current_tenant_digest())
    try:
        quota.hold(batch_id, adding, time.time() + store.ttl_seconds)
    except QuotaFull as exc:
        lapse = quota.first_lapse()
        wait = 1 if lapse is None else max(1, math.ceil(lapse - time.time()))
        raise HttpError(
            429,
            QUOTA_CODE,
            f"this batch's input is {adding} bytes and this key's live batches hold "
            f"{exc.used}: limits.max_batch_input_bytes_per_key is {limit} per key; retry once "
            "earlier batches expire",
            param,
            headers={"Retry-After": str(wait)},
            code=QUOTA_CODE,
        ) from exc
    return quota


def hold_unread_lines(
    svc: Services, store: BatchStore, batch_id: str, lines: int, unread_bytes: int, param: str
) -> None:
    """Holds a new batch's output room from the start: every line's unread error line
    (``unread_bytes``, ``web.batches.unread``) and its files' records, so whichever way its
    reading ends, each line's output or error line has room; a batch whose error lines alone
    do not fit is refused (429 ``file_storage_full`` naming ``param``). The caller releases
    the hold should the batch not be made (``release_unread_lines``)."""
    holding = files_overhead(batch_id) + unread_bytes
    quota = output_quota(svc, current_tenant_digest())
    try:
        quota.hold(holder_of(batch_id), holding, time.time() + store.ttl_seconds)
    except QuotaFull as exc:
        raise storage_full(
            svc,
            exc.used,
            f"this batch's {lines} lines' error lines, held before it runs so that every line "
            f"ends in its output or error file, take {holding} bytes",
            param,
        ) from exc


def release_unread_lines(svc: Services, batch_id: str) -> None:
    """A batch not made holds no output room."""
    output_quota(svc, current_tenant_digest()).release(holder_of(batch_id))


def check_output_room(svc: Services, param: str) -> None:
    """A batch's output is held against the key's file storage line by line before the
    line's jobs are sent (``web.batches.output_room``), its lines waiting for room: so a new
    batch is refused at once (429 ``file_storage_full`` naming ``param``) while the key's files
    and holds already fill that storage, rather than accepted to wait."""
    used = svc.files.quota(current_tenant_digest()).used()
    if used < svc.settings.files.max_bytes_per_key:
        return
    raise storage_full(svc, used, "a batch's output would have no room", param)


def storage_full(svc: Services, used: int, why: str, param: str) -> HttpError:
    """429 ``file_storage_full`` naming ``param``: the key's own figures only."""
    limit = svc.settings.files.max_bytes_per_key
    return HttpError(
        429,
        "file_storage_full",
        f"this key's files hold {used} bytes and files.max_bytes_per_key is {limit}: {why}; "
        "delete files (outputs included) or wait for them to expire",
        param,
        code="file_storage_full",
    )
