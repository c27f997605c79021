"""Publishes token events to Redis off the engine thread, one pipelined round trip per flush.

The engine callback only enqueues; this thread drains everything queued since its last round trip
(every token of a decoding step across the whole batch, or more when Redis is slow) and sends it as
one pipeline: one script that appends to each job's replay log and output, publishes each job's
tokens on that job's own channel and reads its cancel flag; then the final state of jobs that
ended. A normal step's reply is an empty list (only exceptions come back).

Flushes are paced per job: a job's tokens go out at most every interval after its first ones,
while a job's first tokens and its end go at once, alone (the other jobs' tokens stay held for
their paced flush, so an arrival or an end does not cost every running job a message). Every
cost downstream is per message (the script, each PUBLISH, every web process's parse, wake-up and
write, every client's parse), so a step rate of hundreds per second would otherwise cost that
many messages per job; paced, each message carries the tokens of several steps, and time to
first token is untouched. The interval grows with the number of jobs flushed together, to keep
messages under ``max_messages_per_second``, up to ``max_interval_seconds``: under load the
serving path's CPU goes to the engine instead of to messages, while a lone stream keeps the
floor's smoothness.

Redis can acknowledge writes and then lose them (a crash before its append-only file had them):
a job's replay log shorter than the tokens sent, or a final state gone. The publisher keeps what
it sent (``kept_tokens``), restores a log its scripts find short before the next tokens or the
job's end, and sends the final states stored lately again when Redis restarted, so no reader
ever gets a job's end before all of its tokens.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from trickle.job_result import JobResult
from trickle.store.job_store import JobStore, StepAppend, finish_outcome
from worker.kept_tokens import KeptTokens
from worker.publish_items import FinishItem, Forget, Item, Recheck, StepItem, TokenItem

if TYPE_CHECKING:
    from trickle.config.tuning import TuningSettings

log = logging.getLogger(__name__)

MAX_ITEMS_PER_FLUSH = 4096
# A job's first tokens go out unpaced: a leading piece can decode to no visible text, and time to
# first token is what a reader feels.
UNPACED_TOKENS = 2
PUBLISH_RETRY_DELAYS_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)


class TokenPublisher:
    def __init__(
        self,
        store: JobStore,
        on_cancel_requested: Callable[[str], None],
        on_lease_lost: Callable[[str], None],
        on_first_published: Callable[[str, float], None] | None = None,
        flush_interval_seconds: float = 0.0,
        max_interval_seconds: float = 0.0,
        max_messages_per_second: float = 0.0,
    ):
        """``flush_interval_seconds`` is the pace with few jobs; with ``max_messages_per_second``
        it grows with the jobs flushed together, up to ``max_interval_seconds``."""
        self._store = store
        self._pacing = Pacing(flush_interval_seconds, max_interval_seconds, max_messages_per_second)
        self._interval = flush_interval_seconds
        self._last_flush = float("-inf")  # the last flush of every held job (a paced one)
        # Tokens drained but not yet sent, by job (in order): they wait for the paced flush.
        self._held: dict[str, list[TokenItem]] = {}
        # Every token sent, until its final state is stored and a while after: what Redis
        # losing its last writes takes is sent again from there.
        self._kept = KeptTokens()
        # Set by whoever queues a first token, an end or the stop: a paced wait ends early.
        self._urgent = threading.Event()
        self._on_cancel_requested = on_cancel_requested
        self._on_lease_lost = on_lease_lost
        self._on_first_published = on_first_published
        self._queue: queue.SimpleQueue[Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="trickle-publisher", daemon=True)
        self.round_trips = 0
        self._thread.start()

    @classmethod
    def paced_as(
        cls,
        tuning: TuningSettings,
        store: JobStore,
        on_cancel_requested: Callable[[str], None],
        on_lease_lost: Callable[[str], None],
        on_first_published: Callable[[str, float], None] | None = None,
    ) -> TokenPublisher:
        """A publisher paced as ``tuning`` configures its flushes: what a worker runs (and
        what ``bench.scheduler_burst`` measures without the rest of the worker)."""
        return cls(
            store,
            on_cancel_requested,
            on_lease_lost,
            on_first_published,
            flush_interval_seconds=tuning.publish_interval_ms / 1000.0,
            max_interval_seconds=tuning.publish_max_interval_ms / 1000.0,
            max_messages_per_second=tuning.publish_max_messages_per_second,
        )

    @property
    def interval_seconds(self) -> float:
        """The current pace of held jobs' flushes (for tests and logs)."""
        return self._interval

    def publish_step(self, tokens: tuple[TokenItem, ...]) -> None:
        """Called on the engine thread: never blocks, never touches the network."""
        if tokens:
            urgent = any(
                token.first_token_at is not None or token.event.index < UNPACED_TOKENS
                for token in tokens
            )
            self._queue.put(StepItem(tokens, urgent))
            if urgent:
                self._urgent.set()

    def publish_finish(
        self,
        job_id: str,
        fence: str,
        result: JobResult,
    ) -> threading.Event:
        """Queue a job's final state after its tokens; the event is set once Redis answered."""
        item = FinishItem(job_id, fence, result)
        self._queue.put(item)
        self._urgent.set()
        return item.persisted

    def forget(self, job_id: str) -> None:
        """A job ended without a final state from this worker: drop what is kept for it."""
        self._queue.put(Forget(job_id))

    def recheck_finished(self) -> None:
        """Redis restarted (another run_id): the final states stored lately may be lost."""
        self._queue.put(Recheck())
        self._urgent.set()

    def close(self) -> None:
        self._queue.put(None)
        self._urgent.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            items, stopping = self._drain()
            now = time.monotonic()
            if stopping or now >= self._last_flush + self._interval:
                tokens = self._release(None, items)
                self._last_flush = now
                self._interval = self._pacing.interval(len(tokens))
            else:
                tokens = self._release(_urgent_jobs(items), items)
            finishes = [item for item in items if isinstance(item, FinishItem)]
            self._kept.expire(now)
            if any(isinstance(item, Recheck) for item in items):
                finishes += [
                    FinishItem(item.job_id, item.fence, item.result)
                    for item in self._kept.finished_again()
                ]
            if tokens or finishes:
                self._flush(tokens, finishes)
            for item in items:
                if isinstance(item, Forget):
                    self._held.pop(item.job_id, None)
                    self._kept.drop(item.job_id)

    def _drain(self) -> tuple[list[Item], bool]:
        """What was queued by the time a flush is due: the paced moment, or at once for a first
        token or an end. True once the stop was queued (everything held then goes out)."""
        items: list[Item] = []
        if not self._held:
            first = self._queue.get()  # nothing held: sleep until something comes
            if first is None:
                return items, True
            items.append(first)
        if not any(_urgent(item) for item in items):
            pause = self._last_flush + self._interval - time.monotonic()
            if pause > 0:
                # Steps queue up meanwhile without waking this thread (no GIL hand-off per step).
                self._urgent.wait(pause)
        self._urgent.clear()
        while len(items) < MAX_ITEMS_PER_FLUSH:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return items, True
            items.append(item)
        return items, False

    def _release(self, jobs: set[str] | None, items: list[Item]) -> list[list[TokenItem]]:
        """Hold the new tokens, then take out those of ``jobs`` (every job: None): each job's
        tokens in order, one list per job."""
        held = self._held
        for item in items:
            if isinstance(item, StepItem):
                for token in item.tokens:
                    job_id = token.event.job_id
                    if job_id in held:
                        held[job_id].append(token)
                    else:
                        held[job_id] = [token]
        if jobs is None:
            released = list(held.values())
            held.clear()
            return released
        return [held.pop(job_id) for job_id in jobs if job_id in held]

    def _flush(self, tokens: list[list[TokenItem]], finishes: list[FinishItem]) -> None:
        self._kept.add(tokens)
        appends = [_append_of(job_tokens) for job_tokens in tokens]
        while appends or finishes:  # more than one round only where Redis lost tokens
            appends, finishes = self._send(appends, finishes)

    def _send(
        self, appends: list[StepAppend], finishes: list[FinishItem]
    ) -> tuple[list[StepAppend], list[FinishItem]]:
        """One round trip; returns the tokens to send again where a job's log lost some, and
        the final states held back until they are there."""
        calls = 0
        logged = [self._kept.count(item.job_id) for item in finishes]

        def build(pipe: Any) -> None:
            nonlocal calls
            if appends:
                calls = self._store.queue_step(pipe, appends)
            for item, least in zip(finishes, logged, strict=True):
                self._store.queue_finish(pipe, item.job_id, item.fence, item.result, least)

        replies = self._execute_with_retry(build)
        self.round_trips += 1
        short: dict[str, int] = {}
        if appends:
            outcome = self._store.step_outcome(appends, *replies[:calls])
            for job_id in outcome.cancel_requested:
                self._on_cancel_requested(job_id)
            for job_id in outcome.fenced_out:
                self._kept.drop(job_id)
                self._on_lease_lost(job_id)
            short.update(outcome.short_logs)
            if self._on_first_published is not None:
                stored = time.time()
                for append in appends:
                    if append.first_token_at is not None:
                        self._on_first_published(append.job_id, stored)
        held_back: list[FinishItem] = []
        for item, reply in zip(finishes, replies[calls:], strict=True):
            outcome_of_finish = finish_outcome(reply)
            if isinstance(outcome_of_finish, bool):
                self._kept.stored(item, outcome_of_finish, time.monotonic())
                item.persisted.set()
            else:
                short[item.job_id] = min(
                    short.get(item.job_id, outcome_of_finish), outcome_of_finish
                )
                held_back.append(item)
        repairs = [
            repair for job_id, length in short.items() if (repair := self._repair(job_id, length))
        ]
        return repairs, held_back

    def _repair(self, job_id: str, length: int) -> StepAppend | None:
        """The tokens a job's log lost, from ``length`` on, to send again. None where it lost
        some this worker never sent: the job stops, its lease's lapse resumes it from the log as
        after a crash, and its final state no longer waits for them."""
        tokens = self._kept.missing(job_id, length)
        if tokens is None:
            self._on_lease_lost(job_id)
            return None
        return _append_of(tokens)  # with its first token's time, if that was lost too

    def _execute_with_retry(self, build: Callable[[Any], None]) -> list[Any]:
        """Redis being away must not lose tokens: retry the same flush until it lands."""
        attempt = 0
        while True:
            # Each script is atomic and skips what a lost-reply attempt already wrote.
            pipe = self._store.pipeline()
            try:
                build(pipe)
                return list(pipe.execute())
            except redis.exceptions.NoScriptError:
                # A server that lost its scripts: restarted, or a replica promoted by failover.
                self._store.scripts_lost()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                delay = PUBLISH_RETRY_DELAYS_SECONDS[
                    min(attempt, len(PUBLISH_RETRY_DELAYS_SECONDS) - 1)
                ]
                log.warning("publishing tokens failed (%s); retrying in %.2fs", exc, delay)
                time.sleep(delay)
                attempt += 1


def _urgent(item: Item) -> bool:
    """An item whose flush goes at once: an end, or a step with a job's first tokens."""
    return isinstance(item, FinishItem) or (isinstance(item, StepItem) and item.urgent)


def _urgent_jobs(items: list[Item]) -> set[str]:
    """Jobs whose tokens must go out now: a first token among them, or their end."""
    jobs: set[str] = set()
    for item in items:
        if isinstance(item, FinishItem):
            jobs.add(item.job_id)
        elif isinstance(item, StepItem) and item.urgent:
            jobs.update(
                token.event.job_id
                for token in item.tokens
                if token.first_token_at is not None or token.event.index < UNPACED_TOKENS
            )
    return jobs


@dataclass(frozen=True)
class Pacing:
    """How long held tokens wait: the floor with few jobs, longer with many, so a flush's
    messages (one per job) stay under ``max_messages_per_second``; never past the ceiling,
    which bounds the inter-token latency the pacing adds."""

    floor_seconds: float
    ceiling_seconds: float = 0.0
    max_messages_per_second: float = 0.0

    def interval(self, jobs: int) -> float:
        if self.max_messages_per_second <= 0:
            return self.floor_seconds
        wanted = jobs / self.max_messages_per_second
        return max(self.floor_seconds, min(wanted, self.ceiling_seconds))


def _append_of(items: list[TokenItem]) -> StepAppend:
    """One job's held tokens, in order, as its share of a flush (it may span several steps)."""
    return StepAppend(
        job_id=items[0].event.job_id,
        fence=items[0].fence,
        events=[item.event for item in items],
        first_token_at=next(
            (item.first_token_at for item in items if item.first_token_at is not None), None
        ),
    )
