"""Dynamic batching: jobs waiting when the engine is free run together in one generate_batch.

Each engine thread (lane) takes the oldest waiting job, waits up to ``max_batch_wait_ms`` for
company (no wait for a job that arrives after a quiet spell: the window adapts to arrivals), and
runs every waiting job that shares its sampling configuration (up to ``max_batch_size``) as one
batch. Per-job limits (max tokens, stop strings, cancellation) are
enforced in the callback, which stops only its own sequence.

CTranslate2 cannot add a sequence to a running batch, so a job arriving while every lane is busy
would wait for a whole generation. Instead, a young batch is *restarted* with the newcomers: its
sequences stop, and run again at once with the newcomers, each continuing from its prompt plus
what it has generated (same detokenizer, same token count, nothing streamed twice). The price is
the catch-up: CTranslate2 feeds the part of a prompt longer than the batch's shortest one token
per step, so a restarted sequence pauses for about as many steps as it had generated. A batch is
restarted while that pause stays under ``rebatch_max_stall_ms`` (timed from the batch's recent
step rate), so the streams already running keep their inter-token latency bounded, or, past
that, while the pause is at most ``1 / rebatch_wait_ratio`` of what the newcomers would wait for
a lane to free (the running batch's remaining steps): a pause of 100 ms for the running streams
instead of a wait of seconds for the newcomers, once per job at most. The check runs when a job
arrives and again at every decoding step while jobs wait, so a newcomer that could not join at
once (a batch still in its first step, a pause too long) joins as soon as it can.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from worker.engine import Engine, EngineRequest, SamplingKey
from worker.engine.sequence import SequenceState
from worker.engine.step_times import StepTimes
from worker.events import TokenEvent
from worker.jobs import FinishReason, GenerationParams, JobError
from worker.publisher import TokenItem

log = logging.getLogger(__name__)

DEADLINE_ERROR = JobError("deadline_exceeded", "the job ran past limits.max_job_seconds")


@dataclass
class ScheduledJob:
    job_id: str
    fence: str  # this worker's lease on the job: every write carries it
    request: EngineRequest
    state: SequenceState
    deadline: float | None = None  # wall-clock time past which the job is stopped and failed
    ended: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    handed_back: bool = False  # returned to the queue unstarted (graceful shutdown)
    priority: int = 0  # lower runs first (interactive before batch)
    # When this attempt entered a batch, and its token arrival times (metrics and traces).
    batch_started_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    first_published_at: float | None = None  # set by the publisher's confirmation
    # Tokens the engine produced after the worker had ended the sequence (a stop string, a
    # cancel, a deadline): dropped unseen; how many shows how fast the engine's flag is read.
    tokens_after_end: int = 0
    # Token ids generated in this attempt: a restarted batch continues from prompt + these.
    generated_ids: list[int] = field(default_factory=list)
    restarts: int = 0
    long_pauses: int = 0  # restarts past rebatch_max_stall_ms: at most one per job

    def current_request(self) -> EngineRequest:
        """The engine request that continues this job from where it is now."""
        if not self.generated_ids:
            return self.request
        return dataclasses.replace(
            self.request,
            prompt_ids=[*self.request.prompt_ids, *self.generated_ids],
            max_new_tokens=self.request.max_new_tokens - len(self.generated_ids),
        )


@dataclass(frozen=True)
class Resume:
    """What a job had already streamed before its previous worker died."""

    text: str = ""
    count: int = 0


def make_scheduled_job(
    engine: Engine,
    job_id: str,
    prompt_ids: list[int],
    params: GenerationParams,
    fence: str,
    resume: Resume = Resume(),
    deadline: float | None = None,
    priority: int = 0,
) -> ScheduledJob:
    """Engine request plus per-job state; ``prompt_ids`` include any resumed text."""
    state = SequenceState(
        engine.tokenizer,
        prompt_ids,
        params.max_tokens,
        params.stop,
        engine.stop_ids(params),
        resumed_text=resume.text,
        resumed_count=resume.count,
    )
    # A seed matters only when sampling; greedy jobs batch with everyone.
    seed = None if params.is_greedy else params.seed
    remaining = params.max_tokens - resume.count
    sampling = SamplingKey.from_params(params, generated=resume.count)
    request = EngineRequest(prompt_ids, remaining, sampling, seed)
    return ScheduledJob(job_id, fence, request, state, deadline, priority=priority)


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

    def live(self) -> int:
        return sum(1 for job in self.jobs if not job.state.finished)

    def stall_steps(self, newcomers: list[ScheduledJob]) -> int:
        """Steps the longest running sequence would pause to catch up after a restart."""
        running = [
            len(job.request.prompt_ids) + len(job.generated_ids)
            for job in self.jobs
            if not job.state.finished
        ]
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
        return max(
            (
                job.request.max_new_tokens - len(job.generated_ids)
                for job in self.jobs
                if not job.state.finished
            ),
            default=0,
        )


class BatchScheduler:
    def __init__(
        self,
        engine: Engine,
        publish_step: StepSink,
        max_batch_size: int,
        max_batch_wait_ms: float,
        engine_threads: int = 1,
        on_batch: Callable[[int], None] | None = None,
        rebatch_max_stall_ms: float = 0.0,
        quiet_start_after_ms: float = 0.0,
        rebatch_wait_ratio: float = 0.0,
    ):
        self._engine = engine
        self._on_batch = on_batch
        self._publish_step = publish_step
        self._max_batch_size = max_batch_size
        self._max_batch_wait = max_batch_wait_ms / 1000.0
        self._max_stall = rebatch_max_stall_ms / 1000.0
        self._wait_ratio = rebatch_wait_ratio
        self._quiet_after = quiet_start_after_ms / 1000.0
        self._step_times = StepTimes(engine.warm_step_seconds)
        self._pending: list[ScheduledJob] = []
        # When the job before the latest one arrived: after a quiet spell a job starts at once.
        self._previous_arrival = float("-inf")
        self._latest_arrival = float("-inf")
        self._running: list[RunningBatch] = []
        self._idle_lanes = 0
        self._cond = threading.Condition()
        self._closed = False
        self.batch_sizes: deque[int] = deque(maxlen=1000)  # recent sizes, for tests and logs
        self.restarts = 0
        self._threads = [
            threading.Thread(target=self._run, name=f"trickle-engine-{i}", daemon=True)
            for i in range(engine_threads)
        ]
        for thread in self._threads:
            thread.start()

    def take_pending(self) -> list[ScheduledJob]:
        """Remove and return every job not yet in a batch (to hand back on shutdown)."""
        with self._cond:
            pending, self._pending = self._pending, []
            return pending

    def submit(self, job: ScheduledJob) -> None:
        with self._cond:
            self._previous_arrival, self._latest_arrival = self._latest_arrival, time.monotonic()
            self._pending.append(job)
            # Even with a lane idle: a young batch that takes the newcomer for a short pause
            # keeps that lane free for the rest of a burst (or for a job that cannot wait).
            self._restart_a_young_batch()
            self._cond.notify()

    def _restart_a_young_batch(self) -> None:
        """Restart the batch that can take the waiting jobs cheapest, if its running streams'
        pause is short (``rebatch_max_stall_ms``), or, with every lane busy, small beside the
        newcomers' wait for a lane (``rebatch_wait_ratio``). Called under the lock."""
        if self._max_stall <= 0 or not self._pending:
            return
        if self._restart_in_flight():
            return  # one restart at a time: the waiting jobs join the batch being restarted
        now = time.monotonic()
        # The newcomers' alternative: an idle lane now, or the first lane to free up.
        lane_busy = self._idle_lanes == 0
        wait = min((batch.seconds_left(now) for batch in self._running), default=0.0)
        best: tuple[float, RunningBatch, bool] | None = None
        for batch in self._running:
            sampling = batch.requests[0].sampling
            if not _restartable(batch.requests[0]):
                continue
            # Not before its first step: every restart gives each of its jobs a token first, so
            # a stream of arrivals cannot keep a batch from ever speaking.
            if batch.steps == 0:
                continue
            newcomers = [job for job in self._pending if _batches_with(job, sampling)]
            live = batch.live()
            if not newcomers or live + len(newcomers) > self._max_batch_size:
                continue
            stall_steps = batch.stall_steps(newcomers)
            if stall_steps >= batch.remaining_steps():
                continue
            pause = stall_steps * self._step_seconds(batch, live, len(newcomers), now)
            short = pause <= self._max_stall
            # A long pause once per job at most: its inter-token latency stays bounded in all
            # but one gap, however many newcomers follow.
            spares_wait = (
                lane_busy
                and self._wait_ratio > 0
                and pause * self._wait_ratio <= wait
                and not any(job.long_pauses for job in batch.jobs if not job.state.finished)
            )
            if (short or spares_wait) and (best is None or pause < best[0]):
                best = (pause, batch, not short)
        if best is not None:
            _pause, batch, long = best
            batch.restart = True
            self.restarts += 1
            if long:
                for job in batch.jobs:
                    job.long_pauses += 1

    def _step_seconds(self, batch: RunningBatch, live: int, newcomers: int, now: float) -> float:
        """A catch-up step's time at the restarted batch's size: the model's measured step
        time at that size, or (nothing measured) the batch's own, grown linearly with it."""
        measured = self._step_times.estimate(live + newcomers)
        if measured is not None:
            return measured
        return batch.recent_step_seconds(now) * (live + newcomers) / max(live, 1)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            try:
                batch = self._next_batch()
                if batch is None:
                    return
                self._run_batch(batch)
            except Exception:  # a lane that died would leave every later job one lane short
                log.exception("engine lane %s failed; it goes on", threading.current_thread().name)

    def _next_batch(self) -> list[ScheduledJob] | None:
        with self._cond:
            self._idle_lanes += 1  # until this lane has chosen its batch, arrivals join it
            try:
                while True:
                    batch = self._choose_batch()
                    if batch is None or batch:
                        return batch
                    # Another lane's admission window ended first and took every waiting job.
            finally:
                self._idle_lanes -= 1

    def _choose_batch(self) -> list[ScheduledJob] | None:
        """Wait for jobs and the admission window, then take a batch: None once closed, [] if
        another idle lane took the jobs meanwhile (two lanes can wait out windows at once).
        Called under the lock."""
        # Jobs waiting for a restart in flight are its own: they run with its survivors.
        while (not self._pending or self._restart_in_flight()) and not self._closed:
            self._cond.wait()
        if self._closed:
            return None
        deadline = time.monotonic() + self._admission_window()
        while len(self._pending) < self._max_batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._cond.wait(remaining)
        if not self._pending:
            return []
        # Interactive before batch work; arrival order within a priority (sort is stable).
        waiting = sorted(self._pending, key=lambda job: job.priority)
        first = waiting[0].request
        if first.seed is not None:
            batch = [waiting[0]]  # seeded jobs sample step by step, alone
        else:
            batch = [job for job in waiting if _batches_with(job, first.sampling)]
            batch = batch[: self._max_batch_size]
        chosen = {id(job) for job in batch}
        self._pending = [job for job in self._pending if id(job) not in chosen]
        return batch

    def _restart_in_flight(self) -> bool:
        return any(batch.restart for batch in self._running)

    def _admission_window(self) -> float:
        """How long a lane waits for company: the configured window while jobs arrive close
        together, none after a quiet spell (``quiet_start_after_ms`` without an arrival), where
        waiting only delays a lone job; a burst that follows still joins it by a restart."""
        gap = self._latest_arrival - self._previous_arrival
        if self._quiet_after > 0 and len(self._pending) == 1 and gap > self._quiet_after:
            return 0.0
        return self._max_batch_wait

    def _run_batch(self, batch: list[ScheduledJob]) -> None:
        self.batch_sizes.append(len(batch))
        started = time.time()
        for job in batch:
            if job.batch_started_at is None:
                job.batch_started_at = started
        if self._on_batch is not None:
            self._on_batch(len(batch))
        requests = [job.current_request() for job in batch]
        running = RunningBatch(batch, requests)
        with self._cond:
            self._running.append(running)
        step_buffer = StepBuffer(batch, requests, self._publish_step)

        def on_step(
            position: int, step: int, token_id: int, logprob: float | None, is_last: bool
        ) -> bool:
            if running.restart:
                return True  # tokens past a restart are dropped: the restart regenerates them
            if step >= running.steps:
                running.steps = step + 1
                running.stepped(time.monotonic(), self._step_times)
                if self._pending:  # jobs wait for a lane: may one join by a restart now?
                    with self._cond:
                        self._restart_a_young_batch()
            job = batch[position]
            if job.state.finished:
                job.tokens_after_end += 1
            now = time.time()
            if job.deadline is not None and now > job.deadline:
                job.state.request_stop(FinishReason.ERROR, DEADLINE_ERROR)
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
                event = TokenEvent(job.job_id, outcome.index, outcome.text, logprob)
                item = TokenItem(event, job.fence, first)
            finished = outcome.finish_reason is not None
            step_buffer.add(position, step, item, finished)
            return finished

        try:
            self._engine.generate(requests, on_step)
        except Exception as exc:  # the engine failed: every job of this batch fails with it
            log.exception("generate_batch failed for %d job(s)", len(batch))
            for job in batch:
                job.error = exc
                job.state.finish_without_token(FinishReason.ERROR)
        step_buffer.flush()
        with self._cond:
            self._running.remove(running)
            survivors = []
            if running.restart:
                survivors = [job for job in batch if not job.state.finished and job.error is None]
                for job in survivors:
                    job.restarts += 1
                # Ahead of the newcomers: they are older, and the next batch takes them all.
                self._pending[:0] = survivors
                self._cond.notify()
        for job in batch:
            if job in survivors:
                continue
            # Ended without a final callback (a stop seen after the last step, a short batch).
            job.state.finish_without_token(job.state.stop_requested or FinishReason.LENGTH)
            job.ended.set()


def _restartable(request: EngineRequest) -> bool:
    """Whether a restart leaves the batch's outputs unchanged. Not for seeded jobs (they run
    alone), min_tokens (owed per call) or a repetition penalty: CTranslate2 penalizes what a
    sequence generated, not its prompt, so generated tokens fed back as prompt escape it."""
    sampling = request.sampling
    return request.seed is None and sampling.min_tokens == 0 and sampling.repetition_penalty == 1.0


def _batches_with(job: ScheduledJob, sampling: SamplingKey) -> bool:
    """Whether ``job`` may share a batch decoding with ``sampling`` (seeded jobs run alone)."""
    return job.request.sampling == sampling and job.request.seed is None


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
        self._reported: set[int] = set()
        self._items: list[TokenItem] = []

    def add(self, position: int, step: int, item: TokenItem | None, finished: bool) -> None:
        if step != self._step:
            self.flush()
            self._step = step
        self._reported.add(position)
        if item is not None:
            self._items.append(item)
        if finished:
            self._live.discard(position)
        expected = {p for p in self._live if self._first_step[p] <= step}
        if expected <= self._reported:
            self.flush()

    def flush(self) -> None:
        if self._items:
            self._publish_step(tuple(self._items))
        self._items = []
        self._reported = set()
