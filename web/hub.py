"""TokenHub: one Redis subscription per web process, fanned out to every local reader.

Workers publish each decoding step on one channel. Rather than a Redis connection per client
(thousands of SSE streams would mean thousands of connections), a single listener thread (a
greenlet under gunicorn's gevent worker) reads that channel and appends each job's events to that
job's feed, which all local readers of the job share. When the subscription breaks, every feed
gets a RESYNC, and its readers re-read the replay log, so nothing is lost across a reconnect.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import redis

from worker import keys
from worker.events import StepMessage, TokenEvent

log = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 2.0
MAX_DELIVERIES_PER_WAKE = 256
POLL_SECONDS = 1.0


class Signal(str, Enum):
    DONE = "done"  # the job finished: read its final state
    RESYNC = "resync"  # messages may have been missed: re-read the replay log
    STATUS = "status"  # the job was claimed or requeued: read its state


@dataclass(frozen=True)
class Delivery:
    tokens: tuple[TokenEvent, ...] = ()
    signal: Signal | None = None


class JobFeed:
    """Everything this process heard live about one job, shared by all of its local readers.

    The hub appends once per message whatever the number of readers; each reader keeps its own
    cursor. So a message costs O(jobs), not O(readers), and a slow reader holds no backlog of
    its own: it just has further to read when it wakes.
    """

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.readers = 0
        self._changed = threading.Event()

    def append(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)
        changed, self._changed = self._changed, threading.Event()
        changed.set()

    def wait(self, cursor: int, timeout: float) -> bool:
        """True once there is something past ``cursor`` (at most ``timeout`` seconds)."""
        if len(self.deliveries) > cursor:
            return True
        changed = self._changed
        if len(self.deliveries) > cursor:
            return True
        changed.wait(timeout)
        return len(self.deliveries) > cursor


class Subscription:
    """One reader's cursor on its job's feed; live deliveries count from subscription time."""

    def __init__(self, hub: TokenHub, job_id: str, feed: JobFeed):
        self.job_id = job_id
        self._hub = hub
        self._feed = feed
        self._cursor = len(feed.deliveries)
        self._closed = False

    def get(self, timeout: float) -> Delivery | None:
        if not self._feed.wait(self._cursor, timeout):
            return None
        delivery = self._feed.deliveries[self._cursor]
        self._cursor += 1
        return delivery

    def get_all(self, timeout: float) -> list[Delivery]:
        """Wait for one delivery, then take the others already there (a bounded number, so a
        reader far behind writes in pieces instead of building one huge chunk)."""
        if not self._feed.wait(self._cursor, timeout):
            return []
        taken = self._feed.deliveries[self._cursor : self._cursor + MAX_DELIVERIES_PER_WAKE]
        self._cursor += len(taken)
        return taken

    def close(self) -> None:
        """Idempotent: every path that may end a reader calls it, the first one counts."""
        self._hub.unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TokenHub:
    def __init__(self, connect: Callable[[], redis.Redis]):
        self._connect = connect
        self._feeds: dict[str, JobFeed] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active_subscriptions(self) -> int:
        with self._lock:
            return sum(feed.readers for feed in self._feeds.values())

    def subscribe(self, job_id: str) -> Subscription:
        """Register interest in a job; live events flow from this moment on."""
        self._ensure_started()
        with self._lock:
            feed = self._feeds.setdefault(job_id, JobFeed())
            feed.readers += 1
            subscription = Subscription(self, job_id, feed)
        # Without the subscription the reader still works, only by resyncing on its poll timer.
        self._ready.wait(READY_TIMEOUT_SECONDS)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            if subscription._closed:
                return  # closed already (the view and the stream may both close it)
            subscription._closed = True
            feed = self._feeds.get(subscription.job_id)
            if feed is not None:
                feed.readers -= 1
                if feed.readers <= 0:
                    del self._feeds[subscription.job_id]

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trickle-hub", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Stop listening (the app is shutting down); returns within one poll interval."""
        self._stopping.set()
        thread = self._thread
        if isinstance(thread, threading.Thread):
            thread.join(timeout=POLL_SECONDS * 3)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                self._listen()
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.warning("token subscription lost (%s); reconnecting in %.1fs", exc, backoff)
            self._ready.clear()
            self._broadcast(Delivery(signal=Signal.RESYNC))
            self._stopping.wait(backoff)
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
            while not self._stopping.is_set():
                message = pubsub.get_message(timeout=POLL_SECONDS)
                if message is not None and message.get("type") == "message":
                    self._dispatch(message["data"])
        finally:
            pubsub.close()
            client.close()

    def _dispatch(self, raw: str | bytes) -> None:
        with self._lock:
            if not self._feeds:
                return
        step = StepMessage.decode(raw)
        by_job: dict[str, list[TokenEvent]] = {}
        for event in step.tokens:
            by_job.setdefault(event.job_id, []).append(event)
        with self._lock:
            for job_id, events in by_job.items():
                feed = self._feeds.get(job_id)
                if feed is not None:
                    feed.append(Delivery(tokens=tuple(events)))
            for job_id in step.finished:
                feed = self._feeds.get(job_id)
                if feed is not None:
                    feed.append(Delivery(signal=Signal.DONE))
            for job_id in step.changed:
                feed = self._feeds.get(job_id)
                if feed is not None:
                    feed.append(Delivery(signal=Signal.STATUS))

    def _broadcast(self, delivery: Delivery) -> None:
        with self._lock:
            for feed in self._feeds.values():
                feed.append(delivery)
