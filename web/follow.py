"""Follow one job's tokens exactly once, in order, whenever the reader connects.

The reader subscribes first, then reads the replay log, then applies live events, skipping
indexes it already has and re-reading the log when it sees a gap, a reconnect or a quiet spell.
Transport-free: the SSE and WebSocket views only format what this yields.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass

from web.hub import Signal, Subscription, TokenHub
from worker.events import TokenEvent
from worker.jobs import Job
from worker.store import JobStore


@dataclass(frozen=True)
class Done:
    job: Job


@dataclass(frozen=True)
class KeepAlive:
    pass


FollowEvent = TokenEvent | Done | KeepAlive


class JobNotFound(LookupError):
    pass


class JobFollower:
    def __init__(self, store: JobStore, hub: TokenHub, job_id: str, after: int):
        """Subscribe and take the first snapshot; raises JobNotFound for unknown ids."""
        self._store = store
        self._job_id = job_id
        self._next = after + 1
        self._subscription: Subscription = hub.subscribe(job_id)
        job, events = store.snapshot(job_id, self._next)
        if job is None:
            self._subscription.close()
            raise JobNotFound(job_id)
        self._first: tuple[Job, list[TokenEvent]] = (job, events)

    def events(self, keepalive_seconds: float) -> Generator[FollowEvent, None, None]:
        try:
            job, pending = self._first
            while True:
                yield from self._take(pending)
                if job.status.is_terminal:
                    yield Done(job)
                    return
                pending, resync = self._wait(keepalive_seconds)
                if resync is not None:
                    if resync == "quiet":
                        yield KeepAlive()
                    latest, pending = self._store.snapshot(self._job_id, self._next)
                    if latest is None:  # expired while we waited
                        return
                    job = latest
        finally:
            self._subscription.close()

    def _take(self, events: list[TokenEvent]) -> Iterator[TokenEvent]:
        for event in events:
            if event.index == self._next:
                self._next += 1
                yield event

    def _wait(self, timeout: float) -> tuple[list[TokenEvent], str | None]:
        """Live tokens that continue the sequence, or why the log must be re-read."""
        delivery = self._subscription.get(timeout)
        if delivery is None:
            return [], "quiet"
        if delivery.signal is Signal.DONE or delivery.signal is Signal.RESYNC:
            return [], "signal"
        fresh = [event for event in delivery.tokens if event.index >= self._next]
        if fresh and fresh[0].index != self._next:
            return [], "gap"
        return fresh, None
