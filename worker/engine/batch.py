"""A batch on a lane, as the restart and rebalancing policies see it, and its step buffer.

``RunningBatch`` keeps what pricing a restart needs (live sequences, lengths, recent step
time); ``StepBuffer`` hands each decoding step's tokens to the publisher as one unit, the
interface the token plane builds on (one ``publish_step`` call per step, all of its tokens).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from worker.engine import EngineRequest
from worker.engine.scheduled import ScheduledJob
from worker.engine.step_times import StepTimes
from worker.publisher import TokenItem

# Receives every token of one decoding step of one batch at once.
StepSink = Callable[[tuple[TokenItem, ...]], None]


@dataclass
class RunningBatch:
    """A batch on a lane: what the restart policy needs to know about it."""

    jobs: list[ScheduledJob]
    requests: list[EngineRequest]
    started: float = field(default_factory=time.monotonic)
    steps: int = 0
    restart: bool = False  # set under the scheduler's lock; the lane then stops every sequence
    # With ``restart``: the survivors are shared with an idle lane instead of all rerun here.
    split: bool = False
    # Waiting jobs given to this batch's restart: they run with its survivors, on its lane.
    joiners: list[ScheduledJob] = field(default_factory=list)
    long: bool = False  # its restart pauses its streams past rebatch_max_stall_ms
    last_step_at: float | None = None
    step_seconds: float | None = None  # recent decoding step time (moving average)

    def stepped(self, now: float, step_times: StepTimes) -> None:
        """A new decoding step began: update the recent step time (prefill excluded), and the
        model's step time at the size the step that just ended ran with."""
        if self.last_step_at is not None:
            interval = now - self.last_step_at
            previous = self.step_seconds
            self.step_seconds = interval if previous is None else 0.7 * previous + 0.3 * interval
            step_times.observe(self.live(), interval)
        self.last_step_at = now

    def live_jobs(self) -> list[ScheduledJob]:
        return [job for job in self.jobs if not job.state.finished]

    def live(self) -> int:
        return sum(1 for job in self.jobs if not job.state.finished)

    def load(self) -> int:
        """Sequences this batch will run after its restart (if one is due)."""
        return self.live() + len(self.joiners)

    def stall_steps(self, newcomers: list[ScheduledJob]) -> int:
        """Steps the longest running sequence would pause to catch up after a restart."""
        running = [job.total_length() for job in self.live_jobs()]
        if not running:
            return 0
        shortest = min([*running, *(len(job.request.prompt_ids) for job in newcomers)])
        return max(running) - shortest

    def recent_step_seconds(self, now: float) -> float:
        """The batch's recent step time; before two steps, its time per step so far."""
        if self.step_seconds is not None:
            return self.step_seconds
        return (now - self.started) / max(self.steps, 1)

    def seconds_left(self, now: float) -> float:
        """Until this batch's longest live sequence reaches max_tokens (an upper bound)."""
        return self.remaining_steps() * self.recent_step_seconds(now)

    def remaining_steps(self) -> int:
        """Steps until the batch's longest live sequence reaches its max_tokens."""
        return max((job.remaining_tokens() for job in self.live_jobs()), default=0)


class StepBuffer:
    """Collects one decoding step's tokens across a batch, handing them off as one item.

    The step is complete when every sequence expected to speak in it has (a sequence with a
    longer prompt starts later: CTranslate2 feeds its extra prompt tokens through the loop), or
    as soon as a later step begins, so a wrong expectation costs a split step, never a token.
    """

    def __init__(
        self, batch: list[ScheduledJob], requests: list[EngineRequest], publish_step: StepSink
    ):
        self._publish_step = publish_step
        lengths = [len(request.prompt_ids) for request in requests]
        shortest = min(lengths)
        self._first_step = [length - shortest for length in lengths]
        self._live = set(range(len(batch)))
        self._step = -1
        # Who has yet to speak in this step: worked out once per step (O(batch)), then one
        # discard per token, instead of a pass over the whole batch for every token.
        self._waiting: set[int] = set()
        self._items: list[TokenItem] = []

    def add(self, position: int, step: int, item: TokenItem | None, finished: bool) -> None:
        if step != self._step:
            self.flush()
            self._step = step
            first_step = self._first_step
            self._waiting = {p for p in self._live if first_step[p] <= step}
        self._waiting.discard(position)
        if item is not None:
            self._items.append(item)
        if finished:
            self._live.discard(position)
        if not self._waiting:
            self.flush()

    def flush(self) -> None:
        if self._items:
            self._publish_step(tuple(self._items))
        self._items = []
