"""How many jobs wait for a model, as the queue-full check (429) needs it.

Counting a model's queues is a broker round trip per queue (a declaration on kombu's Redis
transport, which sums every priority step with LLEN), and it was 8% of a web process's CPU on
short jobs. The check only needs the exact count near the limit: far below it (under
``headroom`` of the limit), a reading at most ``max_age_seconds`` old plus what this process
admitted since answers. Near the limit every check reads the broker, so the bound stays exact
for one web process; several processes can overshoot it only by what the others admit within
``max_age_seconds`` while the queue is below ``headroom`` of the limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_AGE_SECONDS = 0.5
HEADROOM = 0.5


@dataclass
class _Reading:
    at: float
    depth: int
    admitted_since: int


class AdmissionDepth:
    def __init__(
        self,
        read: Callable[[str], int],
        max_age_seconds: float = MAX_AGE_SECONDS,
        headroom: float = HEADROOM,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._read = read
        self._max_age = max_age_seconds
        self._headroom = headroom
        self._clock = clock
        self._readings: dict[str, _Reading] = {}
        self._lock = threading.Lock()

    def waiting(self, model: str, limit: int, adding: int) -> int:
        """Jobs waiting for ``model``, for a request that would add ``adding`` against
        ``limit``; counts ``adding`` as admitted (a refused request overstates the next
        estimate by that much, until the next reading)."""
        now = self._clock()
        with self._lock:
            reading = self._readings.get(model)
            if reading is not None and now - reading.at < self._max_age:
                estimate = reading.depth + reading.admitted_since
                if estimate + adding <= limit * self._headroom:
                    reading.admitted_since += adding
                    return estimate
        depth = self._read(model)
        with self._lock:
            self._readings[model] = _Reading(now, depth, adding)
        return depth
