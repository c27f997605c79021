"""A model's recent decoding rate by load, so the waiting estimate can see a passing slowdown.

When a burst arrives, the web tier takes in its requests and opens their streams on the same
cores as the engine: for a second or two every decoding step is slower, and the estimate made
then priced every later round at those slow steps, so the burst's waiters were told too long
(docs/performance.md, "the admission's slow steps"). The pace a row decodes at under a load is
a property of the worker, so the estimate compares the tokens a second a row makes now (all
calls together) with the median a row made on the same worker in the last minute at a
comparable load, and expects the future at that pace when now is slower (``slowdown_factor``).
Per row, not the lanes' sum: the sum grows with the rows, so a past at fewer rows priced a full
burst long. A row's rate falls a little as rows are added, so a past at fewer rows prices the
present a little short until the present's own samples outnumber it. Read and written by the
maintenance loop only.

Not known from inside: whether a slowdown passes. The present joins the window, so one that
lasts (another tenant on the cores, longer contexts) is believed once its samples outnumber the
comparable past's: after as long as the past was measured, ``WINDOW_SECONDS`` at most. Rows of
other models and of the tenants' reserve lane share the cores uncounted: their slowing reads as
a passing slowdown. A burst after light load (no past at 3/4 of its rows) is not corrected.
The join rule's opening of a lane (counted in the call's steps now) is left as measured: scaled
too, the burst's ETAs went short (docs/performance.md).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from worker.engine.lane_views import LaneOpening

# How long a measured rate is compared with the present.
WINDOW_SECONDS = 60.0
# A past rate is comparable when it ran at least this share of the rows running now and no
# more than them (at more rows each row went slower: it would hide a slowdown).
COMPARABLE_ROWS = 0.75


@dataclass(frozen=True)
class RateSample:
    at: float  # time.monotonic()
    rows: int  # rows decoding in the model's lanes
    rate: float  # tokens a second, all those rows together


def lanes_rate(lanes: Sequence[LaneOpening]) -> tuple[int, float]:
    """Rows decoding in ``lanes`` and their tokens a second at each call's step now."""
    stepping = [lane for lane in lanes if lane.jobs and lane.step_seconds > 0]
    rows = sum(len(lane.jobs) for lane in stepping)
    return rows, sum(len(lane.jobs) / lane.step_seconds for lane in stepping)


class DecodeRates:
    """One model's lanes' rates of the last ``WINDOW_SECONDS``, one sample an outlook."""

    def __init__(self) -> None:
        self._samples: deque[RateSample] = deque()

    def reference(self, rows: int, now: float) -> float | None:
        """The rate ``rows`` would make at the median rate a row made in the window's samples at
        a comparable load (None: none)."""
        while self._samples and self._samples[0].at < now - WINDOW_SECONDS:
            self._samples.popleft()
        comparable = [
            sample.rate / sample.rows
            for sample in self._samples
            if COMPARABLE_ROWS * rows <= sample.rows <= rows
        ]
        return rows * statistics.median(comparable) if comparable else None

    def slowdown_factor(self, lanes: Sequence[LaneOpening], now: float | None = None) -> float:
        """What the lanes' steps now are multiplied by to go at the window's pace: a row's rate
        now over the comparable past's (at most 1: a faster present is kept as it is); then the
        present joins the window. ``now``: a ``time.monotonic()`` reading (default: now)."""
        rows, rate = lanes_rate(lanes)
        if rows == 0:
            return 1.0
        now = time.monotonic() if now is None else now
        reference = self.reference(rows, now)
        self._samples.append(RateSample(now, rows, rate))
        return 1.0 if reference is None else min(1.0, rate / reference)
