"""Issue 53's goals for a load, and one run's figures against them from each job's token times.

The goals: TTFT p99 <= 250 ms and ITL p99 <= 80 ms at 0.15x and 0.3x of capacity, TTFT p99 <=
500 ms at 0.5x. A job counts towards goodput when it met both on its own: its TTFT within the
TTFT goal and the p99 of its own gaps between tokens within the ITL goal.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.harness.engine_slots import ArrivedJob
from bench.harness.stats import percentile

ITL_GOAL_MS = 80.0


@dataclass(frozen=True)
class Goals:
    ttft_ms: float
    itl_ms: float = ITL_GOAL_MS


def goals_for(load: float) -> Goals:
    """The goals at ``load`` (a fraction of capacity): the TTFT goal loosens at 0.5x."""
    return Goals(ttft_ms=500.0 if load >= 0.5 else 250.0)


def gaps_ms(job: ArrivedJob) -> list[float]:
    times = job.token_times
    return [1000 * (later - earlier) for earlier, later in itertools.pairwise(times)]


def ttft_ms(job: ArrivedJob) -> float:
    if not job.token_times:
        raise ValueError(f"job {job.index} produced no token")
    return 1000 * (job.token_times[0] - job.arrived)


def met_goals(job: ArrivedJob, goals: Goals) -> bool:
    own_itl = percentile(gaps_ms(job), 99) or 0.0
    return ttft_ms(job) <= goals.ttft_ms and own_itl <= goals.itl_ms


def figures(jobs: Sequence[ArrivedJob], goals: Goals, capacity_per_s: float) -> dict[str, Any]:
    """TTFT p50/p99 and ITL p99 in ms, tokens/s from the first arrival to the last token, and
    goodput: the jobs that met both goals, as a count, a share and a rate (jobs/s and x of
    ``capacity_per_s``) over the same span."""
    ttfts = [ttft_ms(job) for job in jobs]
    itls = [gap for job in jobs for gap in gaps_ms(job)]
    span = max(job.token_times[-1] for job in jobs) - min(job.arrived for job in jobs)
    good = sum(1 for job in jobs if met_goals(job, goals))
    good_per_s = good / span if span > 0 else 0.0
    return {
        "jobs": len(jobs),
        "ttft_goal_ms": goals.ttft_ms,
        "itl_goal_ms": goals.itl_ms,
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p99_ms": percentile(ttfts, 99),
        "itl_p99_ms": percentile(itls, 99),
        "tokens_per_s": sum(len(job.token_times) for job in jobs) / span if span > 0 else 0.0,
        "good_jobs": good,
        "good_share": good / len(jobs),
        "goodput_per_s": good_per_s,
        "goodput_x_capacity": good_per_s / capacity_per_s,
    }
