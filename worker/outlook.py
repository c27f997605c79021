"""A worker's side of the waiting estimate: when each of its slots frees, at the measured pace.

Read from what the job threads and the engine callback already record (each running job's
token times and counts, the scheduler's step times and its lanes: their calls' recent steps
and when each takes a newcomer), by the maintenance loop a few times a second; nothing here
runs on the token path. The web tier turns the published outlooks into each queued job's
expected start (trickle/waiting.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from trickle.capacity import slots_per_worker
from trickle.waiting import WorkerOutlook, slots_free_in
from worker.decode_rates import DecodeRates
from worker.engine.lane_views import LaneOpening
from worker.engine.scheduled import ScheduledJob

if TYPE_CHECKING:
    from worker.engine.engine import Engine
    from worker.engine.scheduler import BatchScheduler
    from worker.in_flight import InFlight


def expected_tokens(job: ScheduledJob, ratio: float) -> int:
    """Tokens the job is still expected to make: its max_tokens x the ratio, but at least one
    more than it made, at most what its budget leaves."""
    made = len(job.generated_ids)
    budget = job.request.max_new_tokens
    expected = max(int(budget * ratio + 0.5), made + 1)
    return max(min(expected, budget) - made, 0)


def seconds_per_token(job: ScheduledJob) -> float | None:
    """The job's own measured pace: time between its first and latest token per token."""
    made = len(job.generated_ids)
    first, last = job.first_token_at, job.last_token_at
    if made < 2 or first is None or last is None or last <= first:
        return None
    return (last - first) / (made - 1)


def lane_rows(
    lanes: Sequence[LaneOpening], ends: Mapping[int, float], rows_per_lane: int
) -> tuple[list[float], list[float]]:
    """Seconds until each row of the ``lanes`` takes a newcomer: a running job's row (busy)
    once it ends (``ends``, by ``id(job)``) and its lane opens; an unused row once its lane
    opens (at its running jobs' expected end at the latest: the rule's own bound is by
    max_tokens). The busy rows, then the unused ones."""
    busy: list[float] = []
    unused: list[float] = []
    for lane in lanes:
        mine = [ends[id(job)] for job in lane.jobs if id(job) in ends]
        opens = min(lane.opens_in, max(mine)) if mine else lane.opens_in
        busy.extend(max(end, opens) for end in mine)
        unused.extend([opens] * max(rows_per_lane - len(mine), 0))
    return busy, unused


def model_outlook(
    jobs: Sequence[ScheduledJob],
    slots: int,
    ratio: float,
    step_seconds: Callable[[int], float | None],
    now: float,
    claims_through: float | None = None,
    lanes: Sequence[LaneOpening] = (),
    rows_per_lane: int = 0,
    rates: DecodeRates | None = None,
) -> WorkerOutlook:
    """One model's outlook on this worker: running jobs (in a batch) free their slot after
    their expected tokens at their pace, and a lane's unused rows are free when the lane takes
    a newcomer (``lanes``: ``rows_per_lane`` each); claimed jobs waiting for a lane follow
    them. A job without a pace of its own goes at the others' (or a step's at this load,
    measured). ``claims_through``: the worker's claims up to then are all among ``jobs``.
    ``rates``: the model's recent rates; a call's step slower than they say goes at their pace
    (worker/decode_rates.py)."""
    if rates is not None:  # every call at that pace (not the join rule's opening: see there)
        factor = rates.slowdown_factor(lanes)
        lanes = [replace(lane, step_seconds=lane.step_seconds * factor) for lane in lanes]
    started = [job for job in jobs if job.batch_started_at is not None]
    waiting = [job for job in jobs if job.batch_started_at is None]
    # The pace of the jobs to come: the running calls' steps now (their rows go a token a
    # step), else the running jobs' own, else a step's at this load. A job's own pace is its
    # whole life's, so a burst's jobs carried the slow steps of its admission (the web tier
    # busy with it) into every later job's price: the burst's later ETAs 45-73 % long.
    stepping = sorted(lane.step_seconds for lane in lanes if lane.jobs and lane.step_seconds > 0)
    measured = sorted(pace for job in started if (pace := seconds_per_token(job)) is not None)
    paces = stepping or measured
    fallback = paces[len(paces) // 2] if paces else step_seconds(max(len(started), 1))
    pace = fallback or 0.0
    tokens = {id(job): expected_tokens(job, ratio) for job in started}
    ends = {id(job): tokens[id(job)] * (seconds_per_token(job) or pace) for job in started}
    for lane in lanes:  # a row of a call goes at the call's step now, whatever it went before
        if lane.step_seconds > 0:
            ends.update(
                (id(job), tokens[id(job)] * lane.step_seconds)
                for job in lane.jobs
                if id(job) in tokens
            )
    in_lanes = {id(job) for lane in lanes for job in lane.jobs}
    rows, unused = lane_rows(lanes, ends, rows_per_lane)
    rows.extend(end for key, end in ends.items() if key not in in_lanes)  # a lane not shown
    # Each running job holds one of its ``slots`` (its prefetch window may hold fewer jobs
    # than its lanes have rows); the others take the unused rows that open first.
    rows.extend(sorted(unused)[: max(slots - len(rows), 0)])
    pending = [expected_tokens(job, ratio) for job in waiting]
    free, starts = slots_free_in(rows, pending, slots, pace)
    ids = [job.job_id for job in waiting]
    claimed = tuple(sorted(zip(ids, starts, strict=True), key=lambda pair: pair[1]))
    return WorkerOutlook(now, tuple(free), pace, ratio, claimed, claims_through)


def running_slots(engine: Engine, window: int) -> int:
    """Jobs a model's engine runs at once: its lanes' batches, and its overflow lanes' too
    when the worker's prefetch ``window`` (every served model's lane slots) holds that many of
    its jobs; a tenants' reserve lane is not counted (no key may fill it)."""
    spare = engine.lanes.spare - engine.lanes.reserve  # overflow lanes only
    lanes = engine.settings.max_batch_size * engine.settings.lanes
    return max(min(engine.settings.max_batch_size * (engine.settings.lanes + spare), window), lanes)


def worker_outlooks(
    in_flight: InFlight,
    engines: Mapping[str, Engine],
    schedulers: Mapping[str, BatchScheduler],
    rates: Mapping[str, DecodeRates],
) -> dict[str, WorkerOutlook]:
    """Every served model's outlook (``schedulers``: each model's, for a measured step time
    when no running job measured its pace; ``rates``: each model's recent rates)."""
    through = in_flight.claims_through  # read first: its claims' jobs are all in ``jobs``
    jobs, now = in_flight.by_model(), time.time()
    window = sum(slots_per_worker(engine.settings) for engine in engines.values())
    return {
        model: model_outlook(
            jobs.get(model, ()),
            running_slots(engine, window),
            in_flight.lengths.ratio(model),
            schedulers[model].seconds_per_step,
            now,
            through,
            schedulers[model].lane_openings(),
            engine.settings.max_batch_size,
            rates[model],
        )
        for model, engine in engines.items()
    }
