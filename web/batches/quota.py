"""A key's batch storage: the input its live batches hold in Redis, bounded per key.

A batch keeps every line (its body included) in its items list until the batch expires, for
its output file: a JSONL body's only copy, and a file batch's second one. Without a bound, one
key could pin Redis memory with batch after batch, whatever the job backlog allows (a line may
be refused, or make one short job, and still be stored). A batch's input bytes (the JSONL body,
or its input file's size) are recorded with it and count until its record expires;
``limits.max_batch_input_bytes_per_key`` bounds their sum per key (the anonymous callers share
one). Two batches created at the same moment may both fit the same room: the bound is exact
for a key that sends one batch at a time, and off by at most one batch otherwise.
"""

from __future__ import annotations

import math
import time

from trickle import keys
from web.admission.auth import current_owner
from web.batches.store import BatchStore
from web.common.errors import HttpError
from web.services import Services

QUOTA_CODE = "batch_storage_full"


def stored_input_bytes(store: BatchStore, owner: str) -> tuple[int, float | None]:
    """The input bytes of the owner's live batches, and the creation time of the oldest."""
    listed = store.redis.zrange(keys.batches_of(owner), 0, -1, withscores=True)
    if not listed:
        return 0, None
    pipe = store.redis.pipeline(transaction=False)
    for batch_id, _created in listed:
        pipe.hget(keys.batch(batch_id), "input_bytes")
    total, oldest = 0, None
    for (_batch_id, created), value in zip(listed, pipe.execute(), strict=True):
        if value is not None:  # an expired batch's record is gone, and so is its input
            total += int(value)
            oldest = created if oldest is None else min(oldest, created)
    return total, oldest


def check_batch_storage(svc: Services, store: BatchStore, adding: int, param: str) -> None:
    """Refuse (429 naming ``param``) a batch whose input would take the caller's live batches
    past the limit; the message tells the caller's own figures only."""
    limit = svc.settings.limits.max_batch_input_bytes_per_key
    used, oldest = stored_input_bytes(store, current_owner())
    if used + adding <= limit:
        return
    wait = 1 if oldest is None else max(1, math.ceil(oldest + store.ttl_seconds - time.time()))
    raise HttpError(
        429,
        QUOTA_CODE,
        f"this batch's input is {adding} bytes and this key's live batches hold {used}: "
        f"limits.max_batch_input_bytes_per_key is {limit} per key; retry once earlier batches "
        "expire",
        param,
        headers={"Retry-After": str(wait)},
        code=QUOTA_CODE,
    )
