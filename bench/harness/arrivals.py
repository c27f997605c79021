"""Seeded open-loop Poisson arrivals: one generator for every bench that replays a load.

``bench.admission``, ``bench.outside`` and ``bench.engine_arrivals`` draw their arrival times
here, so the same seed, rate and count give the same arrivals to the scheduler alone, to the
served stack and to CTranslate2 alone, and the three tails can be held against each other.
"""

from __future__ import annotations

import argparse
import random


def poisson_offsets(rate: float, count: int, seed: int) -> list[float]:
    """``count`` arrival times in seconds from the start of a run at ``rate`` a second: the
    first at once, each later one an exponential gap after the one before, drawn from
    ``random.Random(seed)``."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    gaps = random.Random(seed)
    offsets: list[float] = []
    at = 0.0
    for _ in range(count):
        offsets.append(at)
        at += gaps.expovariate(rate)
    return offsets


def add_arrival_options(parser: argparse.ArgumentParser, loads: str) -> None:
    """The options that fix a replayed load, alike in the benches that replay one: the model,
    the loads (fractions of batch-32 capacity), arrivals per load, tokens per job, the seed and
    the capacity in jobs/s (measured when not given)."""
    parser.add_argument("--model", default="46m")
    parser.add_argument("--loads", default=loads, help="fractions of batch-32 capacity")
    parser.add_argument("--jobs", type=int, default=60, help="arrivals per load")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--capacity",
        type=float,
        default=None,
        help="jobs/s the loads are fractions of (default: measured): fixes the arrival rates "
        "across runs on a machine whose speed varies",
    )
