"""The reserve lane: one engine lane more than the slots fill, for keys below their share.

A key's flood fills every slot of a worker (its batches end together, a whole batch at a
time), so another key's job used to wait for one of those batches to end: up to a batch's run,
however fairly the queue took turns. Joining it to a running batch by a restart is no better:
the flood's sequences, far longer than the newcomer's prompt, would pause one step per token
they had generated. So with two keys or more (``Settings.shares_slots``) the engine runs one
lane more (``reserve_lane``: a CTranslate2 replica sharing the weights), and the
worker's prefetch
window holds one batch more than its slots, which no single key may fill
(``worker/dispatch.py``). The reserve lane takes only jobs of keys that hold fewer than their
share of the other lanes' slots while every other lane is busy: an equal share of those slots
among the keys with work on this worker. With one key at work it never runs.

A key's share is counted in what its jobs occupy, not in sequences: a job that runs alone
(``worker.engine.policy.alone``: seeded, or constrained with min_tokens or a repetition
penalty) holds a whole lane however few its rows, so it counts as a lane's slots. Counted as
one sequence, a key whose such jobs filled every ordinary lane still looked far below its
share, and the reserve lane took its next one too, leaving another key's job to wait for one
of them to end. A constrained job that batches (worker/engine/shared_rows.py) holds one row.

Pure decisions over the scheduler's state; it calls them under its lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from worker.engine.batch import RunningBatch
from worker.engine.policy import alone
from worker.engine.scheduled import ScheduledJob

# Jobs between two batches of a lane (a restart: off the old batch, not yet on the new one),
# and whether that lane is the reserve one.
InHand = tuple[Sequence[ScheduledJob], bool]


def occupies(job: ScheduledJob, batch_size: int) -> int:
    """The lane slots ``job`` holds: its one row, or a whole lane's ``batch_size`` for a job
    that runs alone (no other job can share its batch)."""
    return batch_size if alone(job.request) else 1


def keys_below_share(
    pending: Iterable[ScheduledJob],
    running: Sequence[RunningBatch],
    lane_slots: int,
    in_hand: Iterable[InHand] = (),
    *,
    batch_size: int,
) -> set[str]:
    """The keys with work here that hold fewer than an equal share of ``lane_slots`` (the
    slots of the ordinary lanes, ``batch_size`` each), when at least two keys have work; else
    none. A job holds what it ``occupies``."""
    with_work = {job.tenant for job in pending}
    held: Counter[str] = Counter()
    lanes: list[InHand] = [(batch.live_jobs() + batch.joiners, batch.spare) for batch in running]
    for jobs, spare in [*lanes, *in_hand]:
        for job in jobs:
            with_work.add(job.tenant)
            if not spare:
                held[job.tenant] += occupies(job, batch_size)
    if len(with_work) < 2:
        return set()
    share = lane_slots / len(with_work)
    return {tenant for tenant in with_work if held[tenant] < share}


def reserve_candidates(
    pending: Sequence[ScheduledJob],
    running: Sequence[RunningBatch],
    lane_slots: int,
    in_hand: Iterable[InHand] = (),
    *,
    batch_size: int,
) -> list[ScheduledJob]:
    """The waiting jobs the reserve lane may take, most urgent first (arrival order within a
    priority)."""
    below = keys_below_share(pending, running, lane_slots, in_hand, batch_size=batch_size)
    if not below:
        return []
    return sorted((job for job in pending if job.tenant in below), key=lambda job: job.priority)


class ReserveShares:
    """The scheduler's side of the reserve lane, called under its lock: which keys are below
    their share, counting the jobs a restarting lane holds between two batches (off the old
    one, not yet on the new one), which would otherwise look like free slots."""

    def __init__(self, lanes: int, lane_slots: int, batch_size: int, reserving: bool = True):
        """``lane_slots``: the ordinary lanes' slots, ``batch_size`` each; ``tenants``: the
        spare lanes are the tenants' reserve; else they are overflow lanes
        (worker/engine/rebalance.py) and no key is ever below its share."""
        self.lanes = lanes  # spare lanes (0: none)
        self.reserving = reserving and lanes > 0  # False: every answer is "none"
        self.idle = 0  # spare lanes waiting for a job
        self._lane_slots = lane_slots
        self._batch_size = batch_size
        self._in_hand: dict[int, InHand] = {}  # by the id of the lane's next batch (a list)

    def below(self, pending: Sequence[ScheduledJob], running: Sequence[RunningBatch]) -> set[str]:
        if not self.reserving:
            return set()
        return keys_below_share(
            pending, running, self._lane_slots, self._in_hand.values(), batch_size=self._batch_size
        )

    def candidates(
        self, pending: Sequence[ScheduledJob], running: Sequence[RunningBatch]
    ) -> list[ScheduledJob]:
        if not self.reserving or not pending:
            return []
        return reserve_candidates(
            pending, running, self._lane_slots, self._in_hand.values(), batch_size=self._batch_size
        )

    def hand_over(self, jobs: list[ScheduledJob], spare: bool) -> list[ScheduledJob] | None:
        """A restarted batch's jobs on their way to its lane's next batch (None: no jobs)."""
        if not jobs:
            return None
        if self.lanes:
            self._in_hand[id(jobs)] = (jobs, spare)
        return jobs

    def taken(self, jobs: list[ScheduledJob]) -> None:
        """The lane's next batch runs (or failed to): its jobs count as a batch's again."""
        self._in_hand.pop(id(jobs), None)
