"""Where waiting work goes: the batch a waiting job joins, the busy batch an idle lane shares,
a free lane's share of the waiting jobs, and the jobs a spare lane or a restarted batch takes.

``RestartPolicy`` prices each move on one batch; this module weighs the lanes against each
other. The engine has spare lanes too. With named keys they are the reserve
(``worker.engine.fair_share``): they run only jobs of keys below their share of the other lanes
while those are all busy, so one key's flood never makes another key's job wait for a batch to
end. Without them they are overflow lanes: while every lane runs a batch with long to go, a job
that no batch takes with a short pause starts on one at once (``RestartPolicy.overflow``).

The scheduler calls every method under its lock, handing over its waiting jobs and running
batches, and makes each move through its one restart entry point (``restart_rows``); the
decisions keep no jobs of their own, so they cannot drift from the lanes' state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from worker.engine.batch import RunningBatch
from worker.engine.fair_share import ReserveShares
from worker.engine.policy import RestartPolicy, batches_with, takes_along
from worker.engine.scheduled import ScheduledJob


class Restart(Protocol):
    """``BatchScheduler.restart_rows``, as a move asks for it."""

    def __call__(
        self,
        batch: RunningBatch,
        *,
        joiners: Sequence[ScheduledJob] = (),
        split: bool = False,
        long: bool = False,
    ) -> bool: ...


def split_in_flight(running: Sequence[RunningBatch]) -> bool:
    """Whether a split batch is on its way to two lanes: its other half is not yet waiting."""
    return any(batch.split for batch in running)


def join_class(job: ScheduledJob, below_share: bool) -> tuple[object, ...]:
    """What ``RestartPolicy.join`` reads of a waiting job: two jobs of one class get one answer
    from the same batches (its batching configuration, its length, its key's standing)."""
    request = job.request
    return (
        job.priority,
        below_share,
        request.sampling,
        request.prefix,
        request.cache_partition,
        request.seed,
        request.grammar is not None,
        request.shares_calls,
        request.top_logprobs,
        job.total_length(),
    )


def by_priority(jobs: Sequence[ScheduledJob]) -> list[ScheduledJob]:
    """Interactive before batch work; arrival order within a priority (sort is stable)."""
    return sorted(jobs, key=lambda job: job.priority)


class Rebalancer:
    """The moves of work between lanes, decided over the scheduler's state under its lock."""

    def __init__(self, policy: RestartPolicy, shares: ReserveShares, lane_count: int):
        """``shares``: the scheduler's count of the spare lanes and what they hold;
        ``lane_count``: the ordinary lanes."""
        self._policy = policy
        self._shares = shares
        self._lane_count = lane_count
        self._max_batch_size = policy.rules.max_batch_size
        # The spare lanes' role: the tenants' reserve, else (any at all) overflow lanes.
        self._overflow = bool(shares.lanes) and not shares.reserving

    def rebalance(
        self,
        pending: list[ScheduledJob],
        running: Sequence[RunningBatch],
        idle_lanes: int,
        restart: Restart,
    ) -> bool:
        """Apply the policy: with every lane busy, each waiting job joins the batch that is
        smallest with it (by restarting it; the joiner leaves ``pending``); with a lane idle and
        nothing waiting, the lane takes half of a busy batch. One split at a time (its half goes
        to the idle lane). True when an idle overflow lane should take the jobs left waiting."""
        if split_in_flight(running):
            return False
        now = time.monotonic()
        if pending and idle_lanes == 0:
            below = self._shares.below(pending, running)
            overflow = self.overflow_open(now, running, idle_lanes)
            # Waiting jobs alike (see ``join_class``) get the same answer until a join changes
            # the batches: each class is priced once per call, not once per job, so a long
            # queue does not make every decoding step pay for every waiting job.
            refused: set[tuple[object, ...]] = set()
            for job in by_priority(pending):
                if job.tenant in below and self._shares.idle:
                    continue  # the reserve lane starts it at once, pausing no running batch
                alike = join_class(job, job.tenant in below)
                if alike in refused:
                    continue
                join = self._policy.join(self._joinable(job, below, running), job, now)
                if join is None or (overflow and join.long):
                    # None: no batch takes it now; long: an idle overflow lane starts it at
                    # once, so no stream pauses long.
                    refused.add(alike)
                    continue
                pending.remove(job)
                restart(join.batch, joiners=[job], long=join.long)
                refused.clear()
            return overflow and bool(pending)
        if not pending and idle_lanes > 0:
            split = self._policy.split([b for b in running if not b.spare], now)
            if split is not None:
                restart(split.batch, split=True, long=split.long)
        return False

    def share(
        self,
        compatible: list[ScheduledJob],
        pending: Sequence[ScheduledJob],
        running: Sequence[RunningBatch],
        idle_lanes: int,
    ) -> list[ScheduledJob]:
        """A free lane's share of the waiting jobs that can run together: lanes free at the
        same moment divide them (half batches on two cores finish well before a whole one on
        one core), and a lane free beside a busy one leaves it the jobs that even out their
        loads when they can join it by a restart, so a burst that found one lane busy with its
        first job does not pile onto the other."""
        take = -(-len(compatible) // max(idle_lanes, 1))
        lanes = self._lane_count
        if idle_lanes < lanes and take > 1:
            first = compatible[0].request
            busy = sum(b.load() for b in running if not b.spare and batches_with(b.jobs[0], first))
            fair = max(-(-(len(compatible) + busy) // lanes), 1)
            left = compatible[fair:]
            # Only for a short join: a job left waiting on a long one may find it refused.
            join = None
            if left:
                below = self._shares.below(pending, running)
                joinable = self._joinable(left[0], below, running)
                join = self._policy.join(joinable, left[0], time.monotonic())
            if fair < take and join is not None and not join.long:
                take = fair
        return compatible[: min(take, self._max_batch_size)]

    def spare_candidates(
        self, pending: Sequence[ScheduledJob], running: Sequence[RunningBatch], idle_lanes: int
    ) -> list[ScheduledJob]:
        """The waiting jobs an idle spare lane may take, most urgent first, once every ordinary
        lane is busy: those of keys below their share (the tenants' reserve), or every one
        while overflow is open."""
        if idle_lanes:
            return []
        if not self._overflow:
            return self._shares.candidates(pending, running)
        if not self.overflow_open(time.monotonic(), running, idle_lanes):
            return []
        return by_priority(pending)

    def take_along(
        self,
        carried: list[ScheduledJob],
        pending: Sequence[ScheduledJob],
        running: Sequence[RunningBatch],
        spare: bool,
    ) -> list[ScheduledJob]:
        """The waiting jobs a restarted batch (``spare``: on a spare lane) takes along with
        its ``carried`` jobs: a reserve lane's only those of keys below their share; an ordinary
        lane's any but those the idle reserve lane is about to take."""
        if spare and self._shares.reserving:
            waiting = self._shares.candidates(pending, running)
        else:
            left_to_reserve = self._shares.below(pending, running) if self._shares.idle else set()
            waiting = by_priority([job for job in pending if job.tenant not in left_to_reserve])
        room = self._max_batch_size - len(carried)
        return takes_along(carried, waiting, running, room, spare)

    def _joinable(
        self, job: ScheduledJob, below: set[str], running: Sequence[RunningBatch]
    ) -> list[RunningBatch]:
        """The batches ``job`` may join: a reserve lane's only if its key is ``below`` its share
        (an overflow lane's, any)."""
        return [
            batch for batch in running if not batch.spare or self._overflow or job.tenant in below
        ]

    def overflow_open(self, now: float, running: Sequence[RunningBatch], idle_lanes: int) -> bool:
        """Whether an idle overflow lane should take a waiting job no batch takes with a short
        pause: every ordinary lane runs a batch, and the policy says none ends soon."""
        if not self._overflow or not self._shares.idle or idle_lanes:
            return False
        ordinary = [batch for batch in running if not batch.spare]
        spares = len(running) - len(ordinary)
        return len(ordinary) >= self._lane_count and self._policy.overflow(ordinary, now, spares)
