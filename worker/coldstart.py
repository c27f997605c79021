"""Cold start: from the worker process's start to its first claimed job, split into model load
and the rest (interpreter, imports, Celery boot, broker connection, the wait for a message).

Observed once per process, into ``trickle_cold_start_seconds``, when that first job was already
waiting before the worker was ready (someone paid for the start: a scale-up, a restart); a
worker that idles before its first job logs its start-up time but observes nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from trickle.telemetry.metric_defs import COLD_START
from trickle.telemetry.metrics import MetricsRecorder

log = logging.getLogger(__name__)


def process_started_at() -> float:
    """Wall-clock time this process started (Linux /proc), or now where that is unknown."""
    try:
        with open("/proc/self/stat") as stat:
            # Field 22 (starttime, in clock ticks since boot) follows the ")" of the command.
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as uptime:
            since_boot = float(uptime.read().split()[0])
        # Relative to uptime (10 ms resolution), not /proc/stat's btime (whole seconds).
        return time.time() - max(since_boot - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return time.time()


class ColdStart:
    """Times model loads, then observes the cold start when the first job is claimed."""

    def __init__(self, started_at: float | None = None) -> None:
        self.started_at = started_at if started_at is not None else process_started_at()
        self.model_load_seconds = 0.0
        self.ready_at: float | None = None
        self._observed = False
        self._lock = threading.Lock()

    def loaded(self, seconds: float) -> None:
        self.model_load_seconds += seconds

    def ready(self, now: float | None = None) -> None:
        self.ready_at = now or time.time()
        log.info(
            "worker ready %.2f s after its process started (model load %.2f s)",
            self.ready_at - self.started_at,
            self.model_load_seconds,
        )

    def first_claim(
        self, model: str, created_at: float, metrics: MetricsRecorder, now: float | None = None
    ) -> None:
        with self._lock:
            if self._observed:
                return
            self._observed = True
        if self.ready_at is not None and created_at > self.ready_at:
            return  # the worker was up and waiting: nobody paid a cold start
        total = max((now or time.time()) - self.started_at, 0.0)
        load = min(self.model_load_seconds, total)
        for phase, seconds in (("total", total), ("model_load", load), ("rest", total - load)):
            metrics.observe(COLD_START, seconds, model=model, phase=phase)
        log.info(
            "cold start %.2f s to the first claimed job (model load %.2f s, the rest %.2f s)",
            total,
            load,
            total - load,
        )
