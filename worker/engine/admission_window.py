"""How long a free lane waits for company before it runs its batch.

Waiting lets jobs that arrive close together share one batch; after a quiet spell it only
delays a lone job, and a burst that follows still joins that job by a restart. So the window
adapts to arrivals: ``max_batch_wait_ms`` while jobs come close together, none for a job that
arrives ``quiet_start_after_ms`` after the one before.
"""

from __future__ import annotations

import time


class AdmissionWindow:
    """The scheduler's arrival times and the window they give; called under its lock."""

    def __init__(self, max_batch_wait_ms: float, quiet_start_after_ms: float = 0.0):
        """``quiet_start_after_ms``: 0 never starts a job without the window."""
        self._max_wait = max_batch_wait_ms / 1000.0
        self._quiet_after = quiet_start_after_ms / 1000.0
        # When the job before the latest one arrived: after a quiet spell a job starts at once.
        self._previous_arrival = float("-inf")
        self._latest_arrival = float("-inf")

    def arrived(self) -> None:
        """A job arrived now."""
        self._previous_arrival, self._latest_arrival = self._latest_arrival, time.monotonic()

    def seconds(self, waiting: int) -> float:
        """The window for a lane that finds ``waiting`` jobs: none for a lone job that came
        after a quiet spell, else the configured one."""
        gap = self._latest_arrival - self._previous_arrival
        if self._quiet_after > 0 and waiting == 1 and gap > self._quiet_after:
            return 0.0
        return self._max_wait
