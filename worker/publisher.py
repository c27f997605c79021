"""Publishes token events to Redis off the engine thread, one pipelined round trip per flush.

The engine callback only enqueues; this thread drains everything queued since its last round trip
(every token of a decoding step across the whole batch, or more when Redis is slow) and sends it as
one pipeline: RPUSH to each job's replay log, one PUBLISH for all of them, the final state of jobs
that ended, and a read of each running job's cancel flag.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from worker import keys
from worker.events import StepMessage, TokenEvent
from worker.store import JobResult, JobStore

log = logging.getLogger(__name__)

MAX_ITEMS_PER_FLUSH = 4096
RETRY_DELAYS_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class TokenItem:
    event: TokenEvent
    first_token_at: float | None = None


@dataclass(frozen=True)
class StepItem:
    """Every token one decoding step produced across a batch: published together."""

    tokens: tuple[TokenItem, ...]


@dataclass(frozen=True)
class FinishItem:
    job_id: str
    result: JobResult
    persisted: threading.Event = field(default_factory=threading.Event)


class TokenPublisher:
    def __init__(self, store: JobStore, on_cancel_requested: Callable[[str], None]):
        self._store = store
        self._on_cancel_requested = on_cancel_requested
        self._queue: queue.SimpleQueue[StepItem | FinishItem | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="trickle-publisher", daemon=True)
        self.round_trips = 0
        self._thread.start()

    def publish_step(self, tokens: tuple[TokenItem, ...]) -> None:
        """Called on the engine thread: never blocks, never touches the network."""
        if tokens:
            self._queue.put(StepItem(tokens))

    def publish_finish(self, job_id: str, result: JobResult) -> threading.Event:
        """Queue a job's final state; the returned event is set once Redis has it."""
        item = FinishItem(job_id, result)
        self._queue.put(item)
        return item.persisted

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            items = self._drain()
            if items is None:
                return
            self._flush(items)

    def _drain(self) -> list[StepItem | FinishItem] | None:
        """Everything queued since the last round trip: one step, or several when Redis lags."""
        first = self._queue.get()
        if first is None:
            return None
        items: list[StepItem | FinishItem] = [first]
        while len(items) < MAX_ITEMS_PER_FLUSH:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)
                break
            items.append(item)
        return items

    def _flush(self, items: list[StepItem | FinishItem]) -> None:
        token_items = [
            token for item in items if isinstance(item, StepItem) for token in item.tokens
        ]
        tokens = [item.event for item in token_items]
        first_token_at = {
            item.event.job_id: item.first_token_at
            for item in token_items
            if item.first_token_at is not None
        }
        finishes = [item for item in items if isinstance(item, FinishItem)]
        finished_ids = {item.job_id for item in finishes}
        running_ids = sorted({event.job_id for event in tokens} - finished_ids)
        message = StepMessage(tokens=tokens, finished=[item.job_id for item in finishes])

        def build(pipe: redis.client.Pipeline) -> None:
            self._store.queue_tokens(pipe, tokens, first_token_at)
            for item in finishes:
                self._store.queue_finish(pipe, item.job_id, item.result)
            pipe.publish(keys.EVENTS_CHANNEL, message.encode())
            for job_id in running_ids:
                self._store.queue_cancel_check(pipe, job_id)

        replies = self._execute_with_retry(build)
        self.round_trips += 1
        for job_id, flag in zip(
            running_ids, replies[len(replies) - len(running_ids) :], strict=True
        ):
            if flag:
                self._on_cancel_requested(job_id)
        for item in finishes:
            item.persisted.set()

    def _execute_with_retry(self, build: Callable[[redis.client.Pipeline], None]) -> list[object]:
        """Redis being away must not lose tokens: retry the same flush until it lands."""
        attempt = 0
        while True:
            # MULTI/EXEC: a flush lands whole or not at all, so a retry cannot duplicate tokens.
            pipe = self._store.redis.pipeline(transaction=True)
            build(pipe)
            try:
                return list(pipe.execute())
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                delay = RETRY_DELAYS_SECONDS[min(attempt, len(RETRY_DELAYS_SECONDS) - 1)]
                log.warning("publishing tokens failed (%s); retrying in %.2fs", exc, delay)
                time.sleep(delay)
                attempt += 1
