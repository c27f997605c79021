"""The reserve lane: one engine lane more than the slots fill, for keys below their share.

A key's flood fills every slot of a worker (its batches end together, a whole batch at a
time), so another key's job used to wait for one of those batches to end: up to a batch's run,
however fairly the queue took turns. Joining it to a running batch by a restart is no better:
the flood's sequences, far longer than the newcomer's prompt, would pause one step per token
they had generated. So with named keys (``[keys.<name>]``) the engine runs one lane more
(``tenant_reserve_lane``: a CTranslate2 replica sharing the weights), and the worker's prefetch
window holds one batch more than its slots, which no single key may fill
(``worker/dispatch.py``). The reserve lane takes only jobs of keys that hold fewer than their
share of the other lanes' slots while every other lane is busy: an equal share of those slots
among the keys with work on this worker. With one key at work it never runs.

Pure decisions over the scheduler's state; it calls them under its lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from worker.engine.batch import RunningBatch
from worker.engine.scheduled import ScheduledJob


def keys_below_share(
    pending: Iterable[ScheduledJob], running: Sequence[RunningBatch], lane_slots: int
) -> set[str]:
    """The keys with work here that hold fewer than an equal share of ``lane_slots`` (the
    sequences the ordinary lanes can run), when at least two keys have work; else none."""
    with_work = {job.tenant for job in pending}
    held: Counter[str] = Counter()
    for batch in running:
        for job in batch.live_jobs():
            with_work.add(job.tenant)
            if not batch.reserve:
                held[job.tenant] += 1
        for job in batch.joiners:
            with_work.add(job.tenant)
            if not batch.reserve:
                held[job.tenant] += 1
    if len(with_work) < 2:
        return set()
    share = lane_slots / len(with_work)
    return {tenant for tenant in with_work if held[tenant] < share}


def reserve_candidates(
    pending: Sequence[ScheduledJob], running: Sequence[RunningBatch], lane_slots: int
) -> list[ScheduledJob]:
    """The waiting jobs the reserve lane may take, most urgent first (arrival order within a
    priority)."""
    below = keys_below_share(pending, running, lane_slots)
    if not below:
        return []
    return sorted((job for job in pending if job.tenant in below), key=lambda job: job.priority)
