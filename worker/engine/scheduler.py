"""Dynamic batching over the engine's lanes: no lane idles while another holds work to share.

Each engine thread (lane) takes the oldest waiting job, waits up to ``max_batch_wait_ms`` for
company (no wait for a job that arrives after a quiet spell: the window adapts to arrivals), and
runs the waiting jobs that share its sampling configuration and shared prefix (up to
``max_batch_size``) as one batch. When several lanes are free at once they divide the waiting
jobs between them: on a CPU each lane is a core's worth of threads, and two half batches on two
cores finish well before one whole batch on one. Per-job limits (max tokens, stop strings,
cancellation) are enforced in the callback, which stops only its own sequence.

Work moves between batches by *restarting* them, through one entry point
(``restart_rows``, ``worker.engine.restart``): a newcomer that finds every lane busy joins a
young batch, and a lane that falls idle while another runs several sequences takes half of
them. The checks run when a job arrives, when a lane frees, and at every decoding step while
jobs wait or a lane idles. ``worker.engine.rebalance`` decides those moves, and what the spare
lanes (the tenants' reserve, or overflow lanes) take, priced by ``worker.engine.policy``; this
module runs the lanes and holds the lock every decision is taken under.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from trickle.config.lanes import SpareUse
from trickle.jobs import FinishReason
from worker.engine.admission_window import AdmissionWindow
from worker.engine.batch import RunningBatch, StepBuffer, StepSink, step_callback
from worker.engine.engine import Engine
from worker.engine.fair_share import ReserveShares
from worker.engine.lane_views import LaneOpening, lane_openings, lanes_note
from worker.engine.policy import RestartPolicy, RestartRules, halves, runs_with_first
from worker.engine.prefix import PrefixTable
from worker.engine.rebalance import Rebalancer, by_priority, split_in_flight
from worker.engine.restart import RowResume, resume_rows
from worker.engine.scheduled import ScheduledJob
from worker.engine.sharing_gate import RefusalRate, SharingGate
from worker.engine.step_times import StepTimes

__all__ = ["BatchScheduler", "RowResume", "ScheduledJob", "StepSink"]

log = logging.getLogger(__name__)

# How often an idle reserve lane looks at the shares again besides each arrival and lane start.
SPARE_RECHECK_SECONDS = 0.05


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
        rebalance_gain_ratio: float = 0.0,
        prefixes: PrefixTable | None = None,
        on_restart: Callable[[bool], None] | None = None,
        step_times: StepTimes | None = None,
        prefill_seconds_per_token: float | None = None,
        spare_lanes: int = 0,
        spare_use: SpareUse = SpareUse.RESERVE,
        refusals: RefusalRate | None = None,
    ):
        """``step_times`` and ``prefill_seconds_per_token`` price restarts; by default the
        engine's warm-up measurements, refined by every step. A test that checks what the
        scheduler does with a decision passes fixed ones, so the decision does not depend on
        how the cores happened to be shared while the engine warmed up. ``spare_lanes``:
        lanes besides the ``engine_threads`` (the engine must have both), used as
        ``spare_use`` says (trickle/config/lanes.py). ``refusals``: the model's grammar refusal
        rate the sharing gate decides by (by default the engine's, learned from its batches)."""
        self._engine = engine
        self._on_batch = on_batch
        self._on_restart = on_restart  # called with True for a split, False for a join
        self._publish_step = publish_step
        self._max_batch_size = max_batch_size
        self._window = AdmissionWindow(max_batch_wait_ms, quiet_start_after_ms)
        self._step_times = step_times or StepTimes(engine.warm_step_seconds)
        rules = RestartRules(
            max_batch_size,
            max_stall=rebatch_max_stall_ms / 1000.0,
            wait_ratio=rebatch_wait_ratio,
            split_gain_ratio=rebalance_gain_ratio,
            prefill_seconds_per_token=(
                engine.prefill_seconds_per_token
                if prefill_seconds_per_token is None
                else prefill_seconds_per_token
            ),
        )
        self._prefixes = prefixes or PrefixTable((), 0, 1)
        refusals = refusals or engine.refusals
        prefill = rules.prefill_seconds_per_token
        self.sharing = SharingGate(refusals, self._step_times, prefill, max_batch_size)
        self._pending: list[ScheduledJob] = []
        self._running: list[RunningBatch] = []
        self._idle_lanes = 0
        self._shares = ReserveShares(
            spare_lanes,
            max_batch_size * engine_threads,
            max_batch_size,
            reserving=spare_use is SpareUse.RESERVE,
        )
        self._policy = RestartPolicy(rules, self._step_times)
        self._lane_count = engine_threads
        self._rebalancer = Rebalancer(self._policy, self._shares, engine_threads)
        # One lock; the ordinary lanes wait on ``_cond``, the spare lanes on ``_spare_cond``, so
        # an arrival wakes only a lane that may take it, not every lane per job.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._spare_cond = threading.Condition(lock)
        self._closed = False
        self.batch_sizes: deque[int] = deque(maxlen=1000)  # recent sizes, for tests and logs
        self.restarts = 0
        self.splits = 0  # restarts that shared a batch with an idle lane
        self._threads = [
            threading.Thread(target=self._run, name=f"trickle-engine-{i}", daemon=True)
            for i in range(engine_threads)
        ] + [
            threading.Thread(target=self._run, args=(True,), name=f"trickle-spare-{i}", daemon=True)
            for i in range(spare_lanes)
        ]
        for thread in self._threads:
            thread.start()

    def seconds_per_step(self, size: int) -> float | None:
        """A decoding step's measured time at ``size`` sequences (None before any): the
        waiting estimate's pace when no running job has measured its own."""
        return self._step_times.estimate(size)

    def take_pending(self) -> list[ScheduledJob]:
        """Remove and return every job not yet in a batch (to hand back on shutdown)."""
        with self._cond:
            pending, self._pending = self._pending, []
            return pending

    def submit(self, job: ScheduledJob) -> None:
        with self._cond:
            if job.request.seed is None and not job.request.prefix:
                found = self._prefixes.match(job.request.prompt_ids, job.request.cache_partition)
                for evicted in self._prefixes.take_evicted():
                    self._engine.forget_prefix(evicted)
                if found.prefix:
                    job.request = dataclasses.replace(
                        job.request, prefix=found.prefix, cache_partition=found.partition
                    )
            job.request = self.sharing.decided(job.request)
            self._window.arrived()
            job.lanes_at_arrival = lanes_note(
                self._running, self._idle_lanes, self._shares.idle, len(self._pending)
            )
            self._pending.append(job)
            self._rebalance()
            self._cond.notify()
            if self._shares.reserving:
                self._spare_cond.notify()  # its key may be below its share

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._spare_cond.notify_all()

    def lane_openings(self) -> list[LaneOpening]:
        """Each lane a newcomer may start on (never the tenants' reserve), its jobs and when it
        takes the next newcomer (worker/engine/lane_views.py): the waiting estimate's view,
        read by the maintenance loop, never on the token path."""
        with self._cond:
            now, running = time.monotonic(), self._running
            lanes = [b for b in running if not (b.spare and self._shares.reserving)]
            idle = max(self._lane_count - sum(not b.spare for b in lanes), 0)
            if self._rebalancer.overflow_open(now, running, self._idle_lanes):
                idle += self._shares.idle  # an idle overflow lane takes a waiting job now
            return lane_openings(self._policy, lanes, idle, now)

    # -- moving work between batches (under the lock) ------------------------------------------

    def _rebalance(self) -> None:
        """Let the rebalancer move work between lanes now (``worker.engine.rebalance``)."""
        if self._rebalancer.rebalance(
            self._pending, self._running, self._idle_lanes, self.restart_rows
        ):
            self._spare_cond.notify()  # an idle overflow lane takes them

    def restart_rows(
        self,
        batch: RunningBatch,
        rows: Sequence[tuple[ScheduledJob, RowResume]] = (),
        joiners: Sequence[ScheduledJob] = (),
        split: bool = False,
        long: bool = False,
    ) -> bool:
        """Restart ``batch``: the one entry point for every restart (worker/engine/restart.py
        says what a restart does and costs, and what a second user passes).

        Every live row stops at its next token and the lane runs the batch again at once, each
        row from its prompt plus what it streamed (``rows``: plus their ``RowResume``'s forced
        ids, streamed first), with ``joiners`` (taken off the queue by the caller); ``split``:
        the survivors are shared with an idle lane instead; ``long``: the caller priced the
        catch-up past the stall budget (once per job at most). A restart already due takes
        these along; a row that has finished meanwhile is not resumed. From any thread; False
        (nothing changed) if the batch already ended, or joiners are offered to a split."""
        with self._cond:
            if not any(running is batch for running in self._running):
                return False
            if batch.split and joiners:
                return False  # its survivors go to two lanes: no joiner has a place
            for job, where in rows:
                batch.forced[id(job)] = where.forced
            batch.joiners.extend(joiners)
            if long and not batch.long:
                batch.long = True
                for job in batch.live_jobs():
                    job.long_pauses += 1
            if batch.restart:
                return True  # already due: it takes these along
            batch.restart = True
            batch.split = split
            self.restarts += 1
            self.splits += split
            if self._on_restart is not None:
                self._on_restart(split)
            return True

    def running_batch(self, job: ScheduledJob) -> RunningBatch | None:
        """The batch ``job`` runs in now, if any: what a caller of ``restart_rows`` restarts."""
        with self._cond:
            for batch in self._running:
                if any(row is job for row in batch.jobs):
                    return batch
            return None

    # -- the lanes -----------------------------------------------------------------------------

    def _run(self, spare: bool = False) -> None:
        carried: list[ScheduledJob] | None = None
        while True:
            try:
                batch = carried or (self._next_spare_batch() if spare else self._next_batch())
                if batch is None:
                    return
                carried = self._run_batch(batch, spare)
            except Exception:  # a lane that died would leave every later job one lane short
                if carried:
                    with self._cond:
                        self._shares.taken(carried)
                carried = None
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
                if self._shares.lanes and self._pending:
                    self._spare_cond.notify()  # every lane busy now: a spare lane may be due

    def _next_spare_batch(self) -> list[ScheduledJob] | None:
        """A spare lane's next batch, once every ordinary lane is busy: the waiting jobs of
        keys below their share, or (an overflow lane) those no batch takes with a short pause.
        No admission window: their first token is the point."""
        with self._cond:
            self._shares.idle += 1
            try:
                while not self._closed:
                    candidates = self._rebalancer.spare_candidates(
                        self._pending, self._running, self._idle_lanes
                    )
                    if candidates:
                        break
                    # Shares also change as sequences end: look again now and then.
                    self._spare_cond.wait(SPARE_RECHECK_SECONDS)
                if self._closed:
                    return None
                batch = runs_with_first(candidates)[: self._max_batch_size]
                chosen = {id(job) for job in batch}
                self._pending = [job for job in self._pending if id(job) not in chosen]
                return batch
            finally:
                self._shares.idle -= 1

    def _choose_batch(self) -> list[ScheduledJob] | None:
        """Wait for jobs and the admission window, then take a batch: None once closed, [] if
        another idle lane took the jobs meanwhile (two lanes can wait out windows at once).
        Called under the lock."""
        # While a split is in flight its other half is on its way here: take it with the rest.
        while (not self._pending or split_in_flight(self._running)) and not self._closed:
            self._rebalance()  # this lane is idle: is a busy batch worth sharing with it?
            self._cond.wait()
        if self._closed:
            return None
        deadline = time.monotonic() + self._window.seconds(len(self._pending))
        while len(self._pending) < self._max_batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._cond.wait(remaining)
        if not self._pending:
            return []
        compatible = runs_with_first(by_priority(self._pending))
        batch = self._rebalancer.share(compatible, self._pending, self._running, self._idle_lanes)
        chosen = {id(job) for job in batch}
        self._pending = [job for job in self._pending if id(job) not in chosen]
        return batch

    def _run_batch(
        self, batch: list[ScheduledJob], spare: bool = False
    ) -> list[ScheduledJob] | None:
        """Run one batch to its end or its restart; returns the jobs this lane runs next (a
        restarted batch's survivors and joiners, or its half of a split), or None to take from
        the waiting jobs."""
        self.batch_sizes.append(len(batch))
        started = time.time()
        lane = f"{threading.current_thread().name} size {len(batch)}"
        for job in batch:
            if job.batch_started_at is None:
                job.batch_started_at = started
                job.started_in = lane
                if job.request.prefix:
                    request = job.request
                    job.prefix_hit = self._engine.prefix_cached(
                        request.prefix, request.cache_partition
                    )
        if self._on_batch is not None:
            self._on_batch(len(batch))
        requests = [job.current_request() for job in batch]
        running = RunningBatch(batch, requests, spare=spare)
        with self._cond:
            self._running.append(running)
            self._shares.taken(batch)
        step_buffer = StepBuffer(batch, requests, self._publish_step)
        on_step = step_callback(batch, running, step_buffer, self._on_new_step)
        try:
            self._engine.generate(requests, on_step, running.clock)
        except Exception as exc:  # the engine failed: every job of this batch fails with it
            log.exception("generate_batch failed for %d job(s)", len(batch))
            for job in batch:
                job.error = exc
                job.state.finish_without_token(FinishReason.ERROR)
        step_buffer.flush()
        carried, survivors = self._after_batch(running)
        for job in batch:
            if id(job) in survivors:
                continue
            # Ended without a final callback (a stop seen after the last step, a short batch).
            job.state.finish_without_token(job.state.stop_requested or FinishReason.LENGTH)
            job.ended.set()
        return carried

    def _after_batch(self, running: RunningBatch) -> tuple[list[ScheduledJob] | None, set[int]]:
        """Take the batch off the lane. A restarted batch's live jobs run again at once on this
        lane with its joiners (and any waiting job that fits); a split one's longer half stays
        here and the other waits for the idle lane. Returns the jobs this lane runs next and
        the ids of the batch's jobs that go on."""
        with self._cond:
            self._running.remove(running)
            if not running.restart:
                return None, set()
            survivors = resume_rows(running, self._publish_step)
            going_on = {id(job) for job in survivors}
            if running.split:
                carried, given = halves(survivors) if len(survivors) >= 2 else (survivors, [])
                self._pending[:0] = given
                # The idle lane takes the given half (every ordinary lane wakes: notify() could
                # wake one waiting out its admission window instead; spare lanes wait apart).
                self._cond.notify_all()
                return self._shares.hand_over(carried, running.spare), going_on
            carried = [*survivors, *running.joiners]
            if not carried:
                return None, going_on
            fits = self._rebalancer.take_along(carried, self._pending, self._running, running.spare)
            chosen = {id(job) for job in fits}
            self._pending = [job for job in self._pending if id(job) not in chosen]
            return self._shares.hand_over([*carried, *fits], running.spare), going_on

    def _on_new_step(self, running: RunningBatch) -> None:
        """A batch began a decoding step: time it, and (jobs wait for a lane, or a lane waits
        for jobs) see whether a restart helps now."""
        running.stepped(running.clock.started_at, self._step_times)
        if self._pending or self._idle_lanes:
            with self._cond:
                self._rebalance()
