"""Decoding step time by batch size: what a restart's catch-up would cost the running streams.

The restart policy prices a restart as (catch-up steps) x (the bigger batch's step time). The
old estimate scaled the running batch's step time linearly with the batch size, which on the
demo model overstates a 16-sequence step about eightfold (1 sequence: ~2.5 ms a step, 16:
~4.6 ms), so a lone job's lane refused every newcomer and the rest of a burst waited for it to
end. Here the engine's warm-up measures a step at batch size 1 and at ``max_batch_size``, every
decoding step after that refines the size it ran at, and sizes in between are interpolated.
"""

from __future__ import annotations

import bisect
import threading

SMOOTHING = 0.3  # weight of a new observation in a size's moving average


class StepTimes:
    """Seconds per decoding step by number of live sequences; shared by a model's lanes."""

    def __init__(self, seeds: dict[int, float] | None = None, learn: bool = True):
        self._lock = threading.Lock()
        self._learn = learn  # False: the seeds stand (a test that needs fixed prices)
        self._seconds: dict[int, float] = {
            size: seconds for size, seconds in (seeds or {}).items() if size > 0 and seconds > 0
        }
        self._sizes = sorted(self._seconds)

    def observe(self, size: int, seconds: float) -> None:
        """One decoding step of ``size`` live sequences took ``seconds``."""
        if size <= 0 or seconds <= 0 or not self._learn:
            return
        with self._lock:
            previous = self._seconds.get(size)
            if previous is None:
                self._seconds[size] = seconds
                bisect.insort(self._sizes, size)
            else:
                self._seconds[size] = previous + SMOOTHING * (seconds - previous)

    def estimate(self, size: int) -> float | None:
        """A step's time at ``size`` sequences; None before anything was measured.

        Between two measured sizes: linear interpolation. Past the largest: linear growth from
        it (on a CPU a step grows at most about linearly with the batch), so an estimate errs
        toward a longer pause, never a shorter one. Below the smallest: the smallest's time.
        """
        with self._lock:
            if not self._sizes:
                return None
            if size in self._seconds:
                return self._seconds[size]
            index = bisect.bisect_left(self._sizes, size)
            if index == 0:
                return self._seconds[self._sizes[0]]
            low = self._sizes[index - 1]
            if index == len(self._sizes):
                return self._seconds[low] * size / low
            high = self._sizes[index]
            fraction = (size - low) / (high - low)
            return self._seconds[low] + fraction * (self._seconds[high] - self._seconds[low])
