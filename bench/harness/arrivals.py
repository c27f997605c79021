"""Seeded open-loop Poisson arrivals: one generator for every bench that replays a load.

``bench.admission``, ``bench.outside`` and ``bench.engine_arrivals`` draw their arrival times
here, so the same seed, rate and count give the same arrivals to the scheduler alone, to the
served stack and to CTranslate2 alone, and the three tails can be held against each other.
"""

from __future__ import annotations

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
