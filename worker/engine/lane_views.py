"""The lanes as seen from outside the scheduler: the job log's note of them at a job's arrival,
and, for the waiting estimate, when each lane takes its next newcomer.

A lane running a batch has unused rows, but CTranslate2 adds no row to a running call: a
newcomer enters only by a restart the join rule allows (``worker.engine.policy``) or when the
call ends. Counting those rows free now told a burst's first jobs they would start at once when
they waited seconds, so the rule itself says when a newcomer can start there. Read by the
maintenance loop a few times a second (worker/outlook.py), never on the token path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from worker.engine.batch import RunningBatch
from worker.engine.policy import RestartPolicy, restartable
from worker.engine.scheduled import ScheduledJob


@dataclass(frozen=True)
class LaneOpening:
    """One lane a newcomer may start on: the jobs it runs, seconds until it takes the next
    newcomer (0: idle, or it takes one now), and its call's recent step (0: idle): each of
    its rows' pace now, whatever the load was when the row began."""

    jobs: tuple[ScheduledJob, ...]
    opens_in: float
    step_seconds: float = 0.0


def opens_in(
    policy: RestartPolicy, batch: RunningBatch, running: Sequence[RunningBatch], now: float
) -> float:
    """Seconds until ``batch``'s lane takes a newcomer like its rows (its sampling, a prompt no
    longer than theirs), by the join rule: at once before its first step or with a restart due
    (joiners come at no further cost); else the first moment the rule admits one: now, or when
    another of the ``running`` batches ends (a newcomer's wait for a lane is then the next
    batch's, longer, so a long pause may pay, while this batch's own pause grows a step with
    each step); else its own end (``seconds_left``: an upper bound)."""
    end = batch.seconds_left(now)
    live = batch.live_jobs()
    if not live or batch.split:
        return end
    if batch.steps == 0 or batch.restart:
        return 0.0
    size = batch.load() + 1
    if policy.rules.max_stall <= 0 or size > policy.rules.max_batch_size:
        return end
    if not restartable(batch.requests[0]):
        return end
    stall = batch.stall_steps([*batch.joiners, *live])
    remaining = batch.remaining_steps()
    step = batch.recent_step_seconds(now)
    lefts = [other.seconds_left(now) for other in running]
    for at in sorted({0.0, *(left for left in lefts if left < end)}):
        steps = round(at / step) if step > 0 else 0
        wait = min((left - at for left in lefts if left > at), default=0.0)
        if policy.admits(batch, stall + steps, remaining - steps, size, wait, now) is not None:
            return at
    return end


def lane_openings(
    policy: RestartPolicy, running: Sequence[RunningBatch], idle_lanes: int, now: float
) -> list[LaneOpening]:
    """Every lane newcomers may start on: each of the ``running`` batches' lanes, then the
    ``idle_lanes`` (open now)."""
    # A call's steady step time once one is measured, else its recent step time (0: its rows
    # keep their own pace): before a decoding step, its time per step counts its prefill.
    found = [
        LaneOpening(
            tuple(b.live_jobs()),
            opens_in(policy, b, running, now),
            b.steady_step_seconds or b.step_seconds or 0.0,
        )
        for b in running
    ]
    return found + [LaneOpening((), 0.0)] * idle_lanes


def lanes_note(
    running: Sequence[RunningBatch], idle_lanes: int, spare_idle: int, waiting: int
) -> str:
    """The lanes at this moment, for the job log: each running batch as ``lane:live/steps``
    (``r`` marks a spare lane's, ``!`` a restart due), then the idle ordinary and spare lanes
    and the waiting jobs."""
    batches = " ".join(
        f"{'r' if b.spare else 'o'}:{b.live()}/{b.steps}{'!' if b.restart else ''}" for b in running
    )
    return f"{batches or '-'} idle={idle_lanes} spare_idle={spare_idle} waiting={waiting}"
