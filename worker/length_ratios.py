"""How long a model's answers run: the share of max_tokens its finished jobs used.

Kept by the in-flight table as jobs finish (worker/in_flight.py) and read by the worker's
outlook (worker/outlook.py): a model that ends its answers early holds a slot for less than
max_tokens, and the waiting estimate should know it.
"""

from __future__ import annotations

import threading

from trickle.jobs import FinishReason
from worker.engine.scheduled import ScheduledJob

# Weight of a finished job in a model's length ratio (its tokens over its max_tokens).
LENGTH_SMOOTHING = 0.1


class LengthRatios:
    """How much of its max_tokens a model's finished jobs used, a moving average per model: a
    model that ends its answers early (an end token) holds a slot for less than max_tokens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ratios: dict[str, float] = {}

    def finished(self, model: str, job: ScheduledJob) -> None:
        budget = job.request.max_new_tokens
        if budget <= 0 or job.state.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH):
            return  # failed or canceled: says nothing of how long the model's answers run
        ratio = min(job.state.count / budget, 1.0)
        with self._lock:
            previous = self._ratios.get(model)
            self._ratios[model] = (
                ratio if previous is None else previous + LENGTH_SMOOTHING * (ratio - previous)
            )

    def ratio(self, model: str) -> float:
        with self._lock:
            return self._ratios.get(model, 1.0)
