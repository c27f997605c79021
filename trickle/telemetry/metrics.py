"""In-process metric aggregation, flushed to Redis every few seconds by the maintenance loop.

Recording is a dict update under a lock (cheap enough for the engine thread's per-batch call);
the Redis writes happen off the hot path, one pipeline per flush.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections import defaultdict

import redis

from trickle import keys
from trickle.telemetry.metric_defs import Counter, Histogram


def label_string(labels: dict[str, str]) -> str:
    """Labels as stored in a Redis hash field: JSON, so any value (quotes, ``|``) survives."""
    return json.dumps(sorted(labels.items()), separators=(",", ":"))


def parse_labels(stored: str) -> dict[str, str] | None:
    """The labels of a stored field; None for one this version cannot read."""
    try:
        return {str(name): str(value) for name, value in json.loads(stored)}
    except (ValueError, TypeError):
        return None


def count_now(client: redis.Redis, counter: Counter, amount: float = 1, **labels: str) -> None:
    """Count events straight into Redis (for the rare ones outside a worker's job path)."""
    client.hincrbyfloat(keys.METRIC_COUNTERS, f"{counter.name}|{label_string(labels)}", amount)


class MetricsRecorder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, float] = defaultdict(float)
        self._histograms: dict[tuple[str, str], float] = defaultdict(float)

    def count(self, counter: Counter, value: float = 1.0, **labels: str) -> None:
        with self._lock:
            self._counters[f"{counter.name}|{label_string(labels)}"] += value

    def observe(self, histogram: Histogram, value: float, **labels: str) -> None:
        position = bisect.bisect_left(histogram.buckets, value)
        bound = (
            repr(float(histogram.buckets[position]))
            if position < len(histogram.buckets)
            else "+Inf"
        )
        prefix = label_string(labels)
        with self._lock:
            self._histograms[(histogram.name, f"{prefix}|{bound}")] += 1
            self._histograms[(histogram.name, f"{prefix}|sum")] += value
            self._histograms[(histogram.name, f"{prefix}|count")] += 1

    def flush(self, client: redis.Redis) -> None:
        """Add what was recorded since the last flush to the shared totals in Redis."""
        with self._lock:
            counters, self._counters = self._counters, defaultdict(float)
            histograms, self._histograms = self._histograms, defaultdict(float)
        if not counters and not histograms:
            return
        pipe = client.pipeline(transaction=False)
        for field, value in counters.items():
            pipe.hincrbyfloat(keys.METRIC_COUNTERS, field, value)
        for (name, field), value in histograms.items():
            pipe.hincrbyfloat(keys.metric_histogram(name), field, value)
        try:
            pipe.execute()
        except redis.RedisError:
            self._restore(counters, histograms)
            raise

    def _restore(
        self, counters: dict[str, float], histograms: dict[tuple[str, str], float]
    ) -> None:
        with self._lock:
            for field, value in counters.items():
                self._counters[field] += value
            for key, value in histograms.items():
                self._histograms[key] += value
