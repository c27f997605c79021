"""How many jobs wait for a model, as the queue-full check (429) needs it.

Counting a model's queues is a broker round trip per queue (a declaration on kombu's Redis
transport, which sums every priority step with LLEN), a cost paid on every short job. The check
only needs the exact count near the limit: far below it (under
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
        self._in_flight: dict[str, threading.Event] = {}  # a reading under way, by model
        self._lock = threading.Lock()

    def waiting(self, model: str, limit: int, adding: int) -> int:
        """Jobs waiting for ``model``, for a request that would add ``adding`` against
        ``limit``; counts ``adding`` as admitted (a refused request overstates the next
        estimate by that much, until the next reading).

        One reading at a time per model: the requests of a burst that find the reading stale
        wait for the one read in flight, instead of each paying a broker round trip that holds
        the burst's records back from their task messages."""
        leading: threading.Event | None = None  # the reading this call makes for every caller
        while True:
            now = self._clock()
            with self._lock:
                reading = self._readings.get(model)
                if reading is not None and now - reading.at < self._max_age:
                    estimate = reading.depth + reading.admitted_since
                    if estimate + adding <= limit * self._headroom:
                        reading.admitted_since += adding
                        return estimate
                    break  # near the limit: an exact reading of its own
                in_flight = self._in_flight.get(model)
                if in_flight is None:
                    leading = self._in_flight[model] = threading.Event()
                    break
            in_flight.wait(self._max_age)  # then look again: it brought a fresh reading
        try:
            depth = self._read(model)
            with self._lock:
                self._readings[model] = _Reading(now, depth, adding)
            return depth
        finally:
            if leading is not None:
                with self._lock:
                    del self._in_flight[model]
                leading.set()
