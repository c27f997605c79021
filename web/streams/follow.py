"""Follow one job's tokens exactly once, in order, whenever the reader connects.

The reader subscribes first, then reads the replay log, then applies live events, skipping
indexes it already has and re-reading the log when it sees a gap, a reconnect or a quiet spell.
Transport-free: the SSE and WebSocket views only format what this yields.

Status events are derived from what the reader already reads, layered on the token path: the
first snapshot gives the status at connection, a claim's message (``CLAIMED_MESSAGE``) says
running, a requeue's (``STATUS_MESSAGE``) sends the reader to re-read the job, and a live token
seen while the last status said queued means running. A finished job's done message carries its
record (``RECORD_MESSAGE``): a reader holding every token ends on it without a read. A
``Status`` goes out only when the status differs from the last one sent, before the tokens it
precedes (after them for the final status, which comes right before ``Done``). Tokens are
untouched: still exactly once, in order.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from trickle.events import FinalRecord, TokenEvent, TokenRun
from trickle.jobs import Job, JobStatus
from trickle.store.job_store import JobStore
from trickle.waiting_reader import WaitEstimator
from web.streams.hub import Delivery, Signal, Subscription, TokenHub
from web.streams.job_wait import until_deadline


@dataclass(frozen=True)
class Done:
    job: Job


@dataclass(frozen=True)
class KeepAlive:
    pass


@dataclass(frozen=True)
class Status:
    """The job's status changed (or the reader just connected), or, while it is queued, its
    refreshed place (at least once a second). ``position``: queued jobs ahead of it, when queued
    and known; ``eta_seconds``: when it is expected to start (trickle/waiting.py), when known."""

    status: JobStatus
    position: int | None = None
    eta_seconds: float | None = None


# While a job is queued its readers hear its position and expected start this often at least.
WAITING_REFRESH_SECONDS = 1.0


FollowEvent = TokenRun | Status | Done | KeepAlive


def where_waiting(store: JobStore, waiting: WaitEstimator | None, job_id: str) -> Status:
    """A queued job's ``Status``: its place and expected start from the estimate, or, when
    that has none for it, its place in the queue index alone."""
    found = waiting.estimate(job_id) if waiting is not None else None
    if found is not None:
        return Status(JobStatus.QUEUED, found.position, found.eta_seconds)
    return Status(JobStatus.QUEUED, store.queue_position(job_id))


class JobNotFound(LookupError):
    pass


def owned_by(job_tenant_digest: str, caller: str) -> bool:
    """With API keys, a job (or a file, a batch, a response) exists only for the key that
    created it: its tenant digest is the caller's (``caller`` "" without keys)."""
    return not caller or job_tenant_digest == caller


# A pace shorter than this is not worth a timer and a greenlet switch per chunk: the publisher
# already paces each job's messages.
MIN_PAUSE_SECONDS = 0.002


class Resync(str, Enum):
    """Why a follower must re-read the job and its log instead of trusting live messages."""

    QUIET = "quiet"  # nothing arrived within the keep-alive interval
    SIGNAL = "signal"  # done, a reconnect, a status change or an overflow
    GAP = "gap"  # a live token skipped an index


class JobFollower:
    def __init__(
        self,
        store: JobStore,
        hub: TokenHub,
        job_id: str,
        after: int,
        tenant_digest: str = "",
        statuses: bool = True,
        waiting: WaitEstimator | None = None,
    ):
        """Subscribe and take the first snapshot; raises JobNotFound for unknown ids, and for
        another API key's job (``tenant_digest`` is the caller's key digest, "" without keys).
        ``statuses=False``: a reader with no use for status changes (an OpenAI stream) gets
        none, and no queue position is read when it connects. ``waiting``: while the job is
        queued, a ``Status`` with its position and expected start every
        ``WAITING_REFRESH_SECONDS`` (in place of keep-alives), whatever ``statuses`` says."""
        self._store = store
        self._statuses = statuses
        self._waiting = waiting
        self._job_id = job_id
        self._next = after + 1
        self._subscription: Subscription = hub.subscribe(job_id)
        try:
            job, events = store.snapshot(job_id, self._next)
            if job is None or not owned_by(job.tenant_digest, tenant_digest):
                raise JobNotFound(job_id)
        except BaseException:
            self.close()  # a failed first read (Redis away, unknown id) leaks nothing
            raise
        self._first: tuple[Job, list[TokenRun]] = (job, _runs(events))
        self._model = job.model
        self._status: JobStatus | None = None  # the last status sent
        self._lane_waiting = False  # claimed, but waiting for a lane (told as queued)
        self._deadline_passed = False  # its expiry was tried: no more waking for it
        self.trace_context = job.trace_context

    def _end_if_late(self, job: Job) -> None:
        """End the queued job ``expired`` if its deadline passed (no worker may be alive to
        sweep it): its done message then wakes every reader. Tried once: a job the script
        leaves alone (claimed meanwhile, or requeued with tokens) is its worker's to stop."""
        now = time.time()
        if job.deadline is not None and job.deadline <= now:
            self._store.deadlines.expire_late(job.id, job.deadline, now)
            self._deadline_passed = True

    def close(self) -> None:
        """Drop the hub subscription; idempotent, so the view and the generator may both call
        it (a response never iterated, or a client gone mid-stream, still ends here)."""
        self._subscription.close()

    def chunks(
        self, keepalive_seconds: float, pace: Callable[[], float] = lambda: 0.0
    ) -> Generator[list[FollowEvent], None, None]:
        """Events grouped by wake-up: everything that arrived while the reader was busy goes
        out together, so a slow connection gets one write per wake-up, not one per token.

        ``pace()`` gives the least time between chunks (the first token is never held): with
        thousands of readers, a bounded number of wake-ups per second instead of one per reader
        per decoding step is what keeps a web process responsive.
        """
        try:
            job, pending = self._first
            live = False  # pending came from the channel, not from a snapshot with the status
            refresh = False  # a quiet wait while queued: tell the waiter where it stands again
            last_chunk = 0.0
            last_read = time.monotonic()  # the job's snapshot, read when the follower opened
            while True:
                run = self._take(pending)
                tokens: list[FollowEvent] = [run] if run is not None else []
                if job.status.is_terminal:
                    # Tokens the reader still thinks queued ran: "running" precedes them (a
                    # short job's claim, tokens and end can all arrive in one wake-up).
                    started = (
                        self._status_change(JobStatus.RUNNING, live_tokens=True)
                        if tokens and self._status is JobStatus.QUEUED
                        else []
                    )
                    yield [*started, *tokens, *self._status_change(job.status), Done(job)]
                    return
                change = self._status_change(
                    job.status, live and bool(tokens), refresh, job.started_at
                )
                if change or tokens:
                    yield [*change, *tokens]
                if tokens:  # a status alone never delays the first token
                    last_chunk = time.monotonic()
                pause = last_chunk + pace() - time.monotonic()
                if pause > MIN_PAUSE_SECONDS:
                    time.sleep(pause)  # a greenlet sleep under gevent
                waiting = self._waiting is not None and (
                    job.status is JobStatus.QUEUED or self._lane_waiting
                )
                timeout = min(keepalive_seconds, WAITING_REFRESH_SECONDS)
                timeout = timeout if waiting else keepalive_seconds
                if job.status is JobStatus.QUEUED and not self._deadline_passed:
                    timeout = min(timeout, until_deadline(job.deadline, time.time()))
                heard = self._wait(timeout)
                pending, live, refresh = heard.tokens, heard.resync is None, False
                if heard.final is not None:
                    job = heard.final  # every token is in pending or sent: it ends next pass
                elif heard.resync is not None:
                    if heard.resync is Resync.QUIET and not waiting:
                        yield [KeepAlive()]
                    if job.status is JobStatus.QUEUED:
                        self._end_if_late(job)
                    if _refresh_only(heard.resync, job, waiting, last_read, keepalive_seconds):
                        refresh = True  # where it stands, from the shared estimate
                        pending, live = [], False
                        continue
                    last_read = time.monotonic()
                    latest, events = self._store.snapshot(self._job_id, self._next)
                    if latest is None:  # expired while we waited
                        return
                    job, pending = latest, _runs(events)
                    refresh = waiting and heard.resync is Resync.QUIET
                elif heard.claimed and job.status is JobStatus.QUEUED:
                    job = dataclasses.replace(job, status=JobStatus.RUNNING)
        finally:
            self.close()

    def _status_change(
        self,
        status: JobStatus,
        live_tokens: bool = False,
        refresh: bool = False,
        claimed_at: float | None = None,
    ) -> list[Status]:
        """A ``Status`` if the job's status differs from the last one sent (``refresh``: or it
        is still queued, and its waiter is told again where it stands), else nothing.
        ``claimed_at``: when a worker claimed the job, if the snapshot read says."""
        if live_tokens and status is JobStatus.QUEUED:
            status = JobStatus.RUNNING  # tokens flow: the snapshot saying queued is older
        lane_wait = None
        if status is JobStatus.RUNNING and not live_tokens and self._next <= 0 and self._waiting:
            if self._status is JobStatus.QUEUED and not refresh:
                # Just claimed: a worker may still have it wait for a lane. It runs for its
                # reader with its first token, or when the next refresh finds it not waiting.
                self._lane_waiting = True
                return []
            # Claimed, but its worker has it wait for a lane: still waiting, as its reader sees.
            lane_wait = self._waiting.estimate(self._job_id, read_on_miss=False)
            if lane_wait is None and not self._waiting.claim_seen(self._model, claimed_at or 0):
                # Claimed after the outlooks read: told "running" now, a job its worker has
                # wait for a lane would hear nothing more until it starts (a burst's prefetched
                # jobs waited 10 s so). It stays waiting, unplaced, until an outlook says.
                self._lane_waiting = True
                if self._status is JobStatus.QUEUED or not self._statuses:
                    return []
                self._status = JobStatus.QUEUED
                return [Status(JobStatus.QUEUED)]
        self._lane_waiting = lane_wait is not None
        shown = JobStatus.QUEUED if lane_wait is not None else status
        refreshed = refresh and shown is JobStatus.QUEUED
        if not refreshed and (shown is self._status or not self._statuses):
            # A reader without status events keeps what it would show too: a claim then finds
            # it "queued", so a lane wait is told, not taken as running (15 s of silence).
            self._status = shown
            return []
        self._status = shown
        if shown is not JobStatus.QUEUED:
            return [Status(shown)]
        if lane_wait is not None:
            return [Status(shown, lane_wait.position, lane_wait.eta_seconds)]
        return [where_waiting(self._store, self._waiting, self._job_id)]

    def _take(self, runs: list[TokenRun]) -> TokenRun | None:
        """The tokens of ``runs`` from the next index on, as one run (None: nothing new)."""
        taken: list[TokenRun] = []
        for run in runs:
            if run.end <= self._next:
                continue  # had them already
            if run.first > self._next:
                break  # a gap (a snapshot never has one; ``_wait`` sends live gaps to the log)
            taken.append(run.starting_at(self._next))
            self._next = run.end
        return TokenRun.joined(taken) if taken else None

    def _wait(self, timeout: float) -> Heard:
        """Live tokens that continue the sequence (all that are queued), or why the log must be
        re-read: a quiet spell, a signal (done, a requeue, a reconnect) or a gap. Two signals
        need no read: a claim (the job runs now), and a done signal with the job's record when
        the tokens reach its end (the read was done by the script that finished the job)."""
        deliveries = self._subscription.get_all(timeout)
        if not deliveries:
            return Heard([], Resync.QUIET)
        if not self._statuses:
            # Requeued: news only for status events; the tokens' own order (a gap sends it to
            # the log) and the done signal keep such a reader whole without it. A claim is kept:
            # it ends the waiting refreshes.
            deliveries = [d for d in deliveries if d.signal is not Signal.STATUS]
        record = _final_record(deliveries)
        claimed = any(delivery.signal is Signal.CLAIMED for delivery in deliveries)
        if record is None and any(d.signal not in (None, Signal.CLAIMED) for d in deliveries):
            return Heard([], Resync.SIGNAL)
        expected = self._next
        fresh = []
        for delivery in deliveries:
            run = delivery.tokens
            if run is None or run.end <= expected:
                continue
            if run.first > expected:
                return Heard([], Resync.GAP)
            fresh.append(run)
            expected = run.end
        if record is None:
            return Heard(fresh, claimed=claimed)
        if expected != record.logged:
            return Heard([], Resync.SIGNAL)  # tokens went missing: the log has them
        return Heard(fresh, final=record.job)


class Heard(NamedTuple):
    """What one wake-up brought a follower: live tokens, or why to re-read the job; the job's
    final state when its done signal carried it; whether it was claimed meanwhile."""

    tokens: list[TokenRun]
    resync: Resync | None = None
    final: Job | None = None
    claimed: bool = False


def _refresh_only(
    resync: Resync, job: Job, waiting: bool, last_read: float, keepalive_seconds: float
) -> bool:
    """Whether a quiet wake-up of a queued job's reader only tells it where it stands, without
    re-reading the job: its claim, requeue and end come as live signals, and a broken
    subscription as a RESYNC, so a quiet second changed nothing that a read would find. Read
    it anyway once per keep-alive interval, as a running job's reader does. At 1.0x on the
    demo (docs/performance.md, issue 53) hundreds of streams wait, and a read each a second
    took 16 % of the web process's CPU and a script run each in Redis."""
    return (
        resync is Resync.QUIET
        and waiting
        and job.status is JobStatus.QUEUED
        and time.monotonic() - last_read < keepalive_seconds
    )


def _final_record(deliveries: list[Delivery]) -> FinalRecord | None:
    """The record of a done signal among ``deliveries``, if no other signal asks for a read: a
    claim or requeue (STATUS) is superseded by the end, a reconnect (RESYNC) is not."""
    record = next((d.record for d in deliveries if d.signal is Signal.DONE and d.record), None)
    if record is None or any(d.signal is Signal.RESYNC for d in deliveries):
        return None
    return record


def _runs(events: list[TokenEvent]) -> list[TokenRun]:
    """A snapshot's tokens (consecutive, from the log) as one run."""
    return [TokenRun.from_events(events)] if events else []
