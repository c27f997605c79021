"""The batch sweep: what moves every unsettled batch on without anybody reading it.

It runs as a task on the batch queue, every ``files.batch_sweep_seconds``
(``web.batches.tasks``): a batch still ``validating`` whose reading nobody holds (its task died
with its process, or paused on a full key queue) gets an ingest task, every other one a settle
task, which writes its files once its requests have all finished or its window is over. The
sweep itself only sends tasks, so one long batch never delays another's turn. A Redis lock of
half an interval lets one consumer sweep per turn when several send the sweep; the ingest and
finalize leases keep two tasks off one batch should two turns (or a redelivery) meet.
"""

from __future__ import annotations

from collections.abc import Callable

from trickle import keys
from web.batches.finalize import batch_store
from web.batches.store import FINAL_STAGES
from web.services import Services

# (task name, batch id): the sender puts it on the batch queue.
SendTask = Callable[[str, str], None]


def sweep(svc: Services, interval: float, send: SendTask) -> int:
    """Sends each unsettled batch the task it needs; returns how many were sent (0 when another
    consumer holds this turn)."""
    turn = max(int(interval * 500), 1)  # half an interval: the next turn is never skipped
    if not svc.redis.set(keys.batch_sweep(), "1", nx=True, px=turn):
        return 0
    store = batch_store(svc)
    sent = 0
    for batch_id in store.unsettled():
        batch = store.record(batch_id)
        if batch is None or batch.stage in FINAL_STAGES:
            store.settled(batch_id)  # expired, or ended at validation or by an earlier task
            continue
        if batch.stage == "validating":
            if svc.redis.exists(keys.batch_ingest(batch_id)):
                continue  # a task is reading it now
            send(keys.BATCH_INGEST_TASK, batch_id)
        else:
            send(keys.BATCH_SETTLE_TASK, batch_id)
        sent += 1
    return sent
