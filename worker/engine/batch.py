"""A batch on a lane, as the restart and rebalancing policies see it, its step buffer, and
what each token the engine produces does to its job.

``RunningBatch`` keeps what pricing a restart needs (live sequences, lengths, recent step
time); ``StepBuffer`` hands each decoding step's tokens to the publisher as one unit, the
interface the token plane builds on (one ``publish_step`` call per step, all of its tokens);
``step_callback`` is the engine's per-token callback for one batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trickle.jobs import FinishReason, JobError
from worker.engine.request import EngineRequest, Logprob, Scored, StepClock
from worker.engine.scheduled import ScheduledJob
from worker.engine.step_times import StepTimes
from worker.publish_items import TokenItem

log = logging.getLogger(__name__)

# Receives every token of one decoding step of one batch at once.
StepSink = Callable[[tuple[TokenItem, ...]], None]

# Steps a batch's steady pace is measured over (``RunningBatch.steady_step_seconds``).
PACE_STEPS = 16


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
    # Ids forced on rows (by id(job)) before they go on (worker/engine/restart.py, RowResume).
    forced: dict[int, tuple[int, ...]] = field(default_factory=dict)
    long: bool = False  # its restart pauses its streams past rebatch_max_stall_ms
    # On the reserve lane (worker/engine/fair_share.py): its steps share the cores with the
    # other lanes', so they do not price the model's step times.
    spare: bool = False
    last_step_at: float | None = None
    step_seconds: float | None = None  # recent decoding step time (moving average)
    # Its step time over whole stretches of ``PACE_STEPS`` steps (each stretch weighing half):
    # what the waiting estimate prices a row's remaining tokens at. The moving average above
    # follows the last three steps or so, which lanes sharing two cores make swing by half
    # from one moment to the next, and a row's remaining hundreds of tokens multiplied it.
    steady_step_seconds: float | None = None
    pace_from: float | None = None
    pace_steps: int = 0
    clock: StepClock = field(default_factory=StepClock)  # the engine's start of the step seen

    def stepped(self, now: float, step_times: StepTimes) -> None:
        """A new decoding step began: update the recent step time (prefill excluded), and the
        model's step time at the size the step that just ended ran with."""
        if self.last_step_at is not None:
            interval = now - self.last_step_at
            previous = self.step_seconds
            self.step_seconds = interval if previous is None else 0.7 * previous + 0.3 * interval
            if not self.spare:
                step_times.observe(self.live(), interval)
            self._paced(self.last_step_at, now)
        self.last_step_at = now

    def _paced(self, since: float, now: float) -> None:
        """Count a decoding step (from ``since``) into the steady pace's stretch; a whole
        stretch updates it."""
        if self.pace_from is None:
            self.pace_from, self.pace_steps = since, 0
        self.pace_steps += 1
        if self.pace_steps >= PACE_STEPS:
            pace = (now - self.pace_from) / self.pace_steps
            previous = self.steady_step_seconds
            self.steady_step_seconds = pace if previous is None else 0.5 * (previous + pace)
            self.pace_from, self.pace_steps = now, 0

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


# (position in the batch, step, token id, logprob, is last) -> stop this sequence
TokenCallback = Callable[[int, int, int, Logprob, bool], bool]


def step_callback(
    batch: list[ScheduledJob],
    running: RunningBatch,
    step_buffer: StepBuffer,
    on_new_step: Callable[[RunningBatch], None],
) -> TokenCallback:
    """The engine's callback for each token of ``batch``: per-job limits (deadline, stop
    strings, max tokens, cancellation) stop only that job's sequence; ``on_new_step`` runs
    once per decoding step, before its first token."""

    def on_step(position: int, step: int, token_id: int, logprob: Logprob, is_last: bool) -> bool:
        if running.restart:
            return True  # tokens past a restart are dropped: the restart regenerates them
        if step >= running.steps:
            running.steps = step + 1
            on_new_step(running)
        job = batch[position]
        if job.state.finished:
            job.tokens_after_end += 1
        now = time.time()
        if job.deadline is not None and now > job.deadline:
            job.state.request_stop(*job.deadline_stop)
        try:
            outcome = job.state.on_token(token_id, is_last)
        except Exception as exc:  # one job's failure must not take down the whole batch
            log.exception("job %s: token %d could not be processed", job.job_id, token_id)
            job.state.request_stop(FinishReason.ERROR, JobError("engine_error", str(exc)))
            job.state.finish_without_token(FinishReason.ERROR)
            step_buffer.add(position, step, None, True)
            return True
        item = None
        if outcome.index is not None:
            job.generated_ids.append(token_id)
            if job.first_token_at is None:
                job.first_token_at = now
            job.last_token_at = now
            first = now if outcome.index == 0 else None
            if isinstance(logprob, Scored):
                event = job.token_event(outcome, logprob.logprob, logprob.top)
            else:
                event = job.token_event(outcome, logprob)
            item = TokenItem(event, job.fence, first)
        finished = outcome.finish_reason is not None
        step_buffer.add(position, step, item, finished)
        return finished

    return on_step
