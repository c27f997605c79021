"""When to restart a running batch: to take newcomers in, or to share it with an idle lane.

CTranslate2 cannot add a sequence to a running batch (its issue 1333), so both moves are
restarts: the batch's sequences stop and run again from prompt + what they generated. The price
is the catch-up: the prompt's common part is one forward pass (``prefill_seconds_per_token``
per token, timed at warm-up), and the part of a sequence longer than the batch's shortest is
fed one token per step, so the longer sequences pause that many steps.

**Joining** (every lane busy): each newcomer restarts the batch that is smallest with it (one
already due to restart takes it at no further cost), if the running streams' pause stays under
``rebatch_max_stall_ms``, or, past that, if the pause is at most ``1 / rebatch_wait_ratio`` of
the newcomer's wait for a lane (once per job at most, so each stream keeps its inter-token
latency in all but one gap). A burst arriving over a few milliseconds so spreads over the lanes
instead of piling onto the batch that happened to restart first.

**Splitting** (a lane idle, nothing waiting): a batch of several sequences is restarted as two,
one per lane, when the time it saves (the remaining steps, each now at half the batch size and
on two lanes at once) is at least ``rebalance_gain_ratio`` times its catch-up, and at least
``rebatch_max_stall_ms`` (the free lane it takes is worth that to the next arrival). Without it, a
burst that landed on one lane ran there on one core to its end while the other core idled.

**Overflowing** (every lane busy, no short join): a job starts on an idle overflow lane (a
spare CTranslate2 replica, never given a split's half) when the soonest batch to end has more
than ``rebatch_max_stall_ms`` to run. Two lanes each running one long sequence otherwise made a
newcomer wait up to a whole sequence's run, or pause a stream for as many steps as it had
generated. On a CPU it shares the cores while it runs: every stream's steps slow a little,
none stops.

Pure decisions over ``RunningBatch`` state, priced with the model's measured step times; the
scheduler calls them under its lock and applies what they return.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from worker.engine.batch import RunningBatch
from worker.engine.request import EngineRequest, reads_logits
from worker.engine.scheduled import ScheduledJob
from worker.engine.step_times import StepTimes


@dataclass(frozen=True)
class RestartRules:
    """The model's restart knobs, in seconds (see ``ModelSettings``)."""

    max_batch_size: int
    max_stall: float = 0.0  # rebatch_max_stall_ms; 0: never restart
    wait_ratio: float = 0.0  # rebatch_wait_ratio; 0: never past max_stall
    split_gain_ratio: float = 0.0  # rebalance_gain_ratio; 0: never split
    prefill_seconds_per_token: float = 0.0


@dataclass(frozen=True)
class Join:
    batch: RunningBatch
    long: bool  # the pause is past max_stall: each of its jobs' one long pause
    pause: float = 0.0  # seconds its running streams stop to catch up


@dataclass(frozen=True)
class Split:
    batch: RunningBatch
    gain_seconds: float
    long: bool


class RestartPolicy:
    def __init__(self, rules: RestartRules, step_times: StepTimes):
        self.rules = rules
        self._step_times = step_times

    def join(self, running: Sequence[RunningBatch], job: ScheduledJob, now: float) -> Join | None:
        """The batch whose restart ``job`` joins (every lane is busy), if any: the one that is
        smallest with it, so a burst spreads evenly over the lanes. A batch already due to
        restart takes more joiners at no further cost than the larger batch."""
        rules = self.rules
        if rules.max_stall <= 0:
            return None
        wait = min((batch.seconds_left(now) for batch in running), default=0.0)
        best: tuple[int, float, Join] | None = None
        held_back: int | None = None  # the smallest batch that may take it after its next step
        for batch in running:
            first = batch.requests[0]
            if batch.split or not restartable(first) or not batches_with(job, first):
                continue
            size = batch.load() + 1
            # Before its first step only if none of its jobs was restarted yet: a burst that
            # arrives while the lanes prefill spreads over them, and a stream of arrivals still
            # cannot keep a batch from ever speaking (a second restart waits for a token).
            fresh = not any(job.restarts for job in batch.live_jobs())
            if batch.steps == 0 and not batch.restart and not fresh:
                held_back = size if held_back is None else min(held_back, size)
                continue
            if size > rules.max_batch_size:
                continue
            stall_steps = batch.stall_steps([*batch.joiners, job])
            found = self.admits(batch, stall_steps, batch.remaining_steps(), size, wait, now)
            if found is None:
                continue
            key = (size, found.pause)
            if best is None or key < best[:2]:
                best = (*key, found)
        if best is None or (held_back is not None and held_back < best[0]):
            # A smaller batch takes it after its first step (a few ms): waiting for that keeps
            # a burst that arrives one job at a time from piling onto the other lane.
            return None
        return best[2]

    def admits(
        self,
        batch: RunningBatch,
        stall_steps: int,
        remaining_steps: int,
        size: int,
        wait: float,
        now: float,
    ) -> Join | None:
        """The join rule for one batch: a restart that grows it to ``size`` and pauses its
        longest stream ``stall_steps`` with ``remaining_steps`` to run, while a newcomer's wait
        for a lane is ``wait`` seconds: a short pause, else a long one that spares that wait
        ``wait_ratio`` times (once per job), else none."""
        rules = self.rules
        if stall_steps >= remaining_steps:
            return None
        pause = stall_steps * self.step_seconds(batch, size, now)
        short = pause <= rules.max_stall
        spares_wait = (
            rules.wait_ratio > 0
            and pause * rules.wait_ratio <= wait
            and (batch.long or not any(job.long_pauses for job in batch.live_jobs()))
        )
        if not (short or spares_wait):
            return None
        return Join(batch, not short, pause)

    def overflow(self, running: Sequence[RunningBatch], now: float, spares_busy: int = 0) -> bool:
        """Whether a waiting job that no batch takes with a short pause starts on an idle
        overflow lane (``running``: every ordinary lane's batch; ``spares_busy``: overflow
        lanes already running one). Three conditions:

        - the soonest batch to end still has more than one pause budget to run (else the
          newcomer's wait for it is no longer than a join's pause);
        - none is before its first step (one that is takes joiners in a few ms, or ends a
          restart that just took them);
        - the lane's cost to the running streams stays within the pause budget: one more
          lane sharing a saturated device stretches each running step by about
          ``step / lanes`` (the slowest batch's measured recent step time, shared out evenly
          over the lanes running plus this one), every step while both run. A join would
          instead pause them once by its whole catch-up, and waiting costs the newcomer the
          soonest batch's remaining run. Past the budget the device is too busy for another
          lane to help: the join rule (a long pause once per job) or the wait decides."""
        if not running or self.rules.max_stall <= 0:
            return False
        if any(batch.steps == 0 for batch in running):
            return False
        if min(batch.seconds_left(now) for batch in running) <= self.rules.max_stall:
            return False
        lanes = len(running) + spares_busy
        slowest = max(batch.recent_step_seconds(now) for batch in running)
        return slowest / lanes <= self.rules.max_stall

    def split(self, running: Sequence[RunningBatch], now: float) -> Split | None:
        """The batch to share with an idle lane (nothing is waiting), if one is worth it."""
        rules = self.rules
        if rules.split_gain_ratio <= 0 or rules.max_stall <= 0:
            return None
        best: Split | None = None
        for batch in running:
            if batch.restart or batch.steps == 0 or not restartable(batch.requests[0]):
                continue
            live = batch.live_jobs()
            if len(live) < 2:
                continue
            keep, give = halves(live)
            before = max(job.remaining_tokens() for job in live) * self.step_seconds(
                batch, len(live), now
            )
            catch_up = max(self.catch_up(batch, keep, now), self.catch_up(batch, give, now))
            after = catch_up + max(
                max(job.remaining_tokens() for job in half)
                * self.step_seconds(batch, len(half), now)
                for half in (keep, give)
            )
            # Worth at least one pause budget too: a split takes the lane a newcomer would
            # start on at once, and at low load that lane is worth more than a few ms.
            gain = before - after
            if gain < max(rules.split_gain_ratio * catch_up, rules.max_stall):
                continue
            long = catch_up > rules.max_stall
            if long and any(job.long_pauses for job in live):
                continue
            if best is None or gain > best.gain_seconds:
                best = Split(batch, gain, long)
        return best

    def catch_up(self, batch: RunningBatch, jobs: Sequence[ScheduledJob], now: float) -> float:
        """Seconds before ``jobs``, restarted as one batch, all speak again: the common part of
        their lengths as one forward pass, then the longer ones' extra tokens one per step."""
        lengths = [job.total_length() for job in jobs]
        shortest = min(lengths)
        prefill = len(lengths) * shortest * self.rules.prefill_seconds_per_token
        return prefill + (max(lengths) - shortest) * self.step_seconds(batch, len(jobs), now)

    def step_seconds(self, batch: RunningBatch, size: int, now: float) -> float:
        """A decoding step's time at ``size`` sequences: the model's measured step time at that
        size, or (nothing measured) the batch's own, scaled linearly with the size."""
        measured = self._step_times.estimate(size)
        if measured is not None:
            return measured
        return batch.recent_step_seconds(now) * size / max(batch.live(), 1)


def restart_fill(going_on: int, waiting: int, young_loads: Sequence[int], room: int) -> int:
    """How many waiting jobs a restarting batch of ``going_on`` takes along: its share of them,
    counting the other lanes' batches still before their first step (``young_loads``: they take
    joiners within a few ms), at most ``room``.

    Those jobs wait because the join rule holds them for such a batch's first step (a second
    restart before a token would let a stream of arrivals starve it); a restart that took them
    all left a burst as 11 jobs beside 5, and the lane of 5 idle for 1.3 s once it ended."""
    if not young_loads:
        return min(waiting, room)
    total = going_on + waiting + sum(young_loads)
    share = -(-total // (len(young_loads) + 1))  # ceil: this lane takes the odd one
    return max(0, min(waiting, room, share - going_on))


def halves(jobs: Sequence[ScheduledJob]) -> tuple[list[ScheduledJob], list[ScheduledJob]]:
    """Two halves of similar lengths (the longer half stays): each catches up least."""
    ordered = sorted(jobs, key=lambda job: job.total_length(), reverse=True)
    middle = (len(ordered) + 1) // 2
    return ordered[:middle], ordered[middle:]


def restartable(request: EngineRequest) -> bool:
    """Whether a restart leaves the batch's outputs unchanged. Not for seeded jobs (they run
    alone), jobs that read their logits (a constrained one's matcher state lives in the engine
    process, which restarts such rows itself: worker/engine/shared_rows.py), min_tokens (owed
    per call) or a repetition penalty: CTranslate2 penalizes what a sequence generated, not
    its prompt, so generated tokens fed back as prompt escape it."""
    sampling = request.sampling
    return (
        not alone(request)
        and not reads_logits(request)
        and sampling.min_tokens == 0
        and sampling.repetition_penalty == 1.0
    )


def batches_with(job: ScheduledJob, first: EngineRequest) -> bool:
    """Whether ``job`` may share a batch with ``first``: one sampling configuration and one
    shared prefix of one partition (CTranslate2's static prompt is the whole batch's, and
    whether it starts from the cached state is the partition's), both reading their logits or
    neither (such a batch copies them every step, and restarts its rows at a grammar's
    refusals: plain jobs batch and stream exactly as without them), and never one that runs
    ``alone``."""
    request = job.request
    return (
        not alone(request)
        and not alone(first)
        and reads_logits(request) == reads_logits(first)
        and request.sampling == first.sampling
        and request.prefix == first.prefix
        and (not request.prefix or request.cache_partition == first.cache_partition)
    )


def runs_with_first(waiting: Sequence[ScheduledJob]) -> list[ScheduledJob]:
    """The waiting jobs (in order) that can share a batch with the first: one that runs
    ``alone`` by itself, else every one that ``batches_with`` it."""
    first = waiting[0].request
    if alone(first):
        return list(waiting[:1])
    return [job for job in waiting if batches_with(job, first)]


def alone(request: EngineRequest) -> bool:
    """Whether a request runs in a batch of its own: seeded (on a Generator seeded for it), or
    constrained with min_tokens or a repetition penalty (its calls restart at refusals: each
    call owes its own min_length, and CTranslate2 penalizes only what the call generated, so
    a row's calls must be its own), or constrained while the model refuses too often for
    sharing to pay (``shares_calls``: worker/engine/sharing_gate.py). Other constrained jobs,
    and those reporting alternatives, share batches with each other
    (worker/engine/shared_rows.py maps the batched logits)."""
    if request.seed is not None:
        return True
    sampling = request.sampling
    return request.grammar is not None and (
        not request.shares_calls or sampling.min_tokens > 0 or sampling.repetition_penalty != 1.0
    )


def takes_along(
    carried: Sequence[ScheduledJob],
    waiting: Sequence[ScheduledJob],
    running: Sequence[RunningBatch],
    room: int,
    spare: bool,
) -> list[ScheduledJob]:
    """The waiting jobs (most urgent first) a restarting batch of ``carried`` takes along,
    with ``room`` rows left: those that can share its batch, less the share of the other
    lanes' batches still before their first step (they take joiners within a few ms; a spare
    lane's restart counts none). ``running``: every batch on a lane."""
    first = carried[0].request
    fits = [job for job in waiting if batches_with(job, first)]
    young = (
        []
        if spare
        else [
            batch.load()
            for batch in running
            if not batch.spare
            and batch.steps == 0
            and not batch.split
            and batches_with(carried[0], batch.requests[0])
        ]
    )
    return fits[: restart_fill(len(carried), len(fits), young, room)]
