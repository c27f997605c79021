"""TokenHub: one Redis subscription per web process, fanned out to every local reader.

Workers publish each decoding step on one channel. Rather than a Redis connection per client
(thousands of SSE streams would mean thousands of connections), a single listener thread (a
greenlet under gunicorn's gevent worker) reads that channel and drops each job's events into the
queues of the readers following that job. When the subscription breaks, every reader is told to
resynchronise from the replay log, so nothing is lost across a reconnect.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import redis

from worker import keys
from worker.events import StepMessage, TokenEvent

log = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 2.0
MAX_PENDING = 256
POLL_SECONDS = 1.0


class Signal(str, Enum):
    DONE = "done"  # the job finished: read its final state
    RESYNC = "resync"  # messages may have been missed: re-read the replay log


@dataclass(frozen=True)
class Delivery:
    tokens: tuple[TokenEvent, ...] = ()
    signal: Signal | None = None


class Subscription:
    """One reader's mailbox. Bounded: a reader that falls MAX_PENDING deliveries behind gets
    its backlog replaced by one RESYNC, and catches up from the replay log instead, so a slow
    client costs a re-read, never unbounded memory in the web process."""

    def __init__(self, hub: TokenHub, job_id: str):
        self.job_id = job_id
        self._hub = hub
        self._queue: queue.Queue[Delivery] = queue.Queue()
        self.overflows = 0

    def put(self, delivery: Delivery) -> None:
        if self._queue.qsize() >= MAX_PENDING:
            self._drain()
            self.overflows += 1
            delivery = Delivery(signal=Signal.RESYNC)
        self._queue.put(delivery)

    def get(self, timeout: float) -> Delivery | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def get_all(self, timeout: float) -> list[Delivery]:
        """Wait for one delivery, then take every other one already queued."""
        first = self.get(timeout)
        return [] if first is None else [first, *self._drain()]

    def _drain(self) -> list[Delivery]:
        taken = []
        while True:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                return taken

    def close(self) -> None:
        self._hub.unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TokenHub:
    def __init__(self, connect: Callable[[], redis.Redis]):
        self._connect = connect
        self._subscriptions: dict[str, set[Subscription]] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def connected(self) -> bool:
        return self._ready.is_set()

    @property
    def active_subscriptions(self) -> int:
        with self._lock:
            return sum(len(subs) for subs in self._subscriptions.values())

    def subscribe(self, job_id: str) -> Subscription:
        """Register interest in a job; live events flow from this moment on."""
        self._ensure_started()
        subscription = Subscription(self, job_id)
        with self._lock:
            self._subscriptions.setdefault(job_id, set()).add(subscription)
        # Without the subscription the reader still works, only by resyncing on its poll timer.
        self._ready.wait(READY_TIMEOUT_SECONDS)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            subs = self._subscriptions.get(subscription.job_id)
            if subs is not None:
                subs.discard(subscription)
                if not subs:
                    del self._subscriptions[subscription.job_id]

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trickle-hub", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                self._listen()
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.warning("token subscription lost (%s); reconnecting in %.1fs", exc, backoff)
            self._ready.clear()
            self._broadcast(Delivery(signal=Signal.RESYNC))
            threading.Event().wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _listen(self) -> None:
        client = self._connect()
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(keys.EVENTS_CHANNEL)
            pubsub.get_message(timeout=POLL_SECONDS)  # the subscribe confirmation
            self._ready.set()
            # Anything published while we were away is in the replay logs.
            self._broadcast(Delivery(signal=Signal.RESYNC))
            while True:
                message = pubsub.get_message(timeout=POLL_SECONDS)
                if message is not None and message.get("type") == "message":
                    self._dispatch(message["data"])
        finally:
            pubsub.close()
            client.close()

    def _dispatch(self, raw: str | bytes) -> None:
        with self._lock:
            if not self._subscriptions:
                return
        step = StepMessage.decode(raw)
        by_job: dict[str, list[TokenEvent]] = {}
        for event in step.tokens:
            by_job.setdefault(event.job_id, []).append(event)
        with self._lock:
            for job_id, events in by_job.items():
                for subscription in self._subscriptions.get(job_id, ()):
                    subscription.put(Delivery(tokens=tuple(events)))
            for job_id in step.finished:
                for subscription in self._subscriptions.get(job_id, ()):
                    subscription.put(Delivery(signal=Signal.DONE))

    def _broadcast(self, delivery: Delivery) -> None:
        with self._lock:
            for subs in self._subscriptions.values():
                for subscription in subs:
                    subscription.put(delivery)
