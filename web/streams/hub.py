"""TokenHub: the tokens of the jobs this web process's readers follow, fanned out to them.

Each job has its own channel (``keys.job_events_channel``), and a process subscribes to it only
while a local reader follows the job (one connection for all of them, see ``subscriber``): so a
process receives, and decodes, only tokens it will write to someone. A ``Prefer: wait`` waiter
needs the finish, not the tokens: it subscribes to the job's done channel instead. Messages for
a job go to that job's feed, which all local readers of the job share. When the subscription
breaks, every feed gets a RESYNC and its readers re-read the replay log, so nothing is lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple

from trickle import keys
from trickle.events import FinalRecord, JobMessage, TokenRun
from web.streams.subscriber import ChannelSubscriber

log = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 2.0
MAX_DELIVERIES_PER_WAKE = 256


class Signal(str, Enum):
    DONE = "done"  # the job finished: its record came with it, or read its final state
    RESYNC = "resync"  # messages may have been missed: re-read the replay log
    STATUS = "status"  # the job was requeued: read its state
    CLAIMED = "claimed"  # the job was claimed: it runs (nothing to read)


class Delivery(NamedTuple):
    """A message's tokens, or a signal; a DONE from the job's own worker carries its record."""

    tokens: TokenRun | None = None
    signal: Signal | None = None
    record: FinalRecord | None = None


class JobFeed:
    """Everything this process heard live about one job, shared by all of its local readers.

    The hub appends once per message whatever the number of readers; each reader keeps its own
    cursor. So a message costs O(jobs), not O(readers), and a slow reader holds no backlog of
    its own: it just has further to read when it wakes.
    """

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.readers = 0  # subscriptions to its tokens (streams)
        self.interested = 0  # every subscription: streams and waiters
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

    def __init__(self, hub: TokenHub, job_id: str, feed: JobFeed, channel: str):
        self.job_id = job_id
        self.channel = channel
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
    def __init__(self, connect: Callable[[], Any]):
        self._feeds: dict[str, JobFeed] = {}
        self._lock = threading.Lock()
        self._subscriber = ChannelSubscriber(
            connect, self._dispatch, self._resubscribed, self._lost
        )
        # What this process received, for benchmarks and tests: every message is a followed
        # job's (or one that just stopped being followed), never another process's.
        self.received_messages = 0
        self.received_tokens = 0
        self._readers = 0

    @property
    def active_subscriptions(self) -> int:
        """Open streams (readers of tokens; ``Prefer: wait`` waiters are not streams): a count
        kept as readers come and go, since every stream's pace reads it once per write."""
        return self._readers

    def subscribe(self, job_id: str) -> Subscription:
        """Follow a job's tokens; live events flow from the moment this returns."""
        return self._open(job_id, keys.job_events_channel(job_id), reader=True)

    def watch(self, job_id: str) -> Subscription:
        """Hear when a job finishes (a DONE delivery), without its tokens."""
        return self._open(job_id, keys.job_done_channel(job_id), reader=False)

    def _open(self, job_id: str, channel: str, reader: bool) -> Subscription:
        with self._lock:
            feed = self._feeds.setdefault(job_id, JobFeed())
            feed.interested += 1
            if reader:
                feed.readers += 1
                self._readers += 1
        ready = self._subscriber.add(channel)
        # Without the subscription the reader still works, only by resyncing on its poll timer.
        ready.wait(READY_TIMEOUT_SECONDS)
        with self._lock:
            return Subscription(self, job_id, feed, channel)

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            if subscription._closed:
                return  # closed already (the view and the stream may both close it)
            subscription._closed = True
            feed = self._feeds.get(subscription.job_id)
            if feed is not None:
                feed.interested -= 1
                if subscription.channel == keys.job_events_channel(subscription.job_id):
                    feed.readers -= 1
                    self._readers -= 1
                if feed.interested <= 0:
                    del self._feeds[subscription.job_id]
        self._subscriber.remove(subscription.channel)

    def close(self) -> None:
        """Stop listening (the app is shutting down); returns within one poll interval."""
        self._subscriber.close()

    def _dispatch(self, channel: str, raw: str) -> None:
        job_id = keys.job_of_channel(channel)
        with self._lock:
            feed = self._feeds.get(job_id)
        self.received_messages += 1
        if feed is None:
            return  # its last reader left while the message travelled
        message = JobMessage.decode(raw)
        with self._lock:
            if message.tokens is not None:
                self.received_tokens += len(message.tokens)
                feed.append(Delivery(tokens=message.tokens))
            if message.done:
                feed.append(Delivery(signal=Signal.DONE, record=message.record))
            if message.status_changed:
                feed.append(Delivery(signal=Signal.STATUS))
            if message.claimed:
                feed.append(Delivery(signal=Signal.CLAIMED))

    def _resubscribed(self, channel: str) -> None:
        """A channel is live (again): readers that were already following re-read the log."""
        with self._lock:
            feed = self._feeds.get(keys.job_of_channel(channel))
            if feed is not None:
                feed.append(Delivery(signal=Signal.RESYNC))

    def _lost(self) -> None:
        self._broadcast(Delivery(signal=Signal.RESYNC))

    def _broadcast(self, delivery: Delivery) -> None:
        with self._lock:
            for feed in self._feeds.values():
                feed.append(delivery)
