"""Wait for one job to end, for the routes that answer with a finished job (``?wait=``, a
non-streaming completion, a cancel that reports the outcome).

Apart from ``web.streams.follow``: a waiter wants no token, only the job's end, so it listens
to the done signal alone and reads the job's status, never its replay log. Both share
``until_deadline``, the one rule for how long a reader of a queued job may wait before its
client's deadline asks it to look again (and to end the job ``expired`` itself, if no worker
is alive to do it).
"""

from __future__ import annotations

import time

from trickle.jobs import Job, JobStatus
from trickle.store.deadlines import DEADLINE_SLACK_SECONDS
from trickle.store.job_store import JobStore
from web.streams.hub import Subscription, TokenHub


def wait_for_job(store: JobStore, hub: TokenHub, job_id: str, seconds: float) -> Job | None:
    """Block until the job ends or ``seconds`` pass; returns its latest state (None if unknown).

    Subscribing before the first read means a completion cannot slip between read and wait.
    A waiter hears only the job's done signal and reads only its status until the end (and,
    while it is queued, its deadline, once): what it costs Redis does not grow with the job's
    tokens. A queued job's waiter wakes at its deadline and ends it ``expired`` if it is still
    queued: with no worker alive to sweep it, its readers still hear at its deadline.
    """
    deadline = time.monotonic() + seconds
    expires: float | None = None  # its client's deadline (unix s), read once while queued
    unread = True
    with hub.watch(job_id) as subscription:
        while True:
            status = store.status(job_id)
            if status is None or status.is_terminal:
                break
            wake = deadline
            if status is JobStatus.QUEUED and unread:
                expires, unread = store.deadlines.of(job_id), False
            if status is JobStatus.QUEUED and expires is not None:
                now = time.time()
                if expires <= now:  # no worker may be alive to end it: this reader does, once
                    ended = store.deadlines.expire_late(job_id, expires, now)
                    expires = None
                    if ended:
                        continue
                else:
                    wake = min(deadline, time.monotonic() + until_deadline(expires, now))
            heard = _await_signal(subscription, wake)
            if isinstance(heard, Job):
                return heard  # the record its done signal carried: what a read would give
            if not heard and time.monotonic() >= deadline:
                break
    return store.get(job_id)


def _await_signal(subscription: Subscription, deadline: float) -> bool | Job:
    """Wait for a reason to look again (done, a reconnect, a quiet second); False once the
    deadline passed; the finished job when its done signal carried its record. Tokens (a local
    stream of the same job shares the feed) are no reason."""
    while (remaining := deadline - time.monotonic()) > 0:
        delivery = subscription.get(min(remaining, 1.0))
        if delivery is not None and delivery.record is not None:
            return delivery.record.job
        if delivery is None or delivery.signal is not None:
            return True
    return False


def until_deadline(deadline: float | None, now: float) -> float:
    """Seconds a reader of a queued job may wait before its deadline asks it to look again
    (just after it); infinite without a deadline."""
    if deadline is None:
        return float("inf")
    return max(deadline - now, 0.0) + DEADLINE_SLACK_SECONDS
