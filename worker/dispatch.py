"""Celery's worker consumes every generation task; this hands each one to the runtime's job threads.

Celery keeps the broker protocol (fetch, prefetch window, acks, redelivery) and its tooling
(``inspect active`` and ``stats``, task events for Flower). What Trickle changes is only what
happens to a ``trickle.generate`` request once Celery's consumer has it, through the documented
hook for that, a task ``Strategy`` (``celery.worker.strategy``):

- the request is registered with ``celery.worker.state`` as Celery's own strategy does, so
  ``inspect active`` lists the running job (its id is the task's argument) and ``inspect stats``
  counts it;
- instead of a trip through the pool and the task tracer, it goes to a ``JobDispatcher``: one
  thread claims every request that arrived since its last claim in one Redis round trip
  (``claim_many``; the worker's runtime gives each fresh claimed job to its engine right there,
  ``WorkerRuntime.claim_and_start``), then each claimed job runs ``run_job`` in one of
  ``slots`` job threads, which waits for its end and stores it.
  Even the request is built on that thread: Celery's consumer thread only appends the message,
  so it is back reading the broker at once (in a 16-job burst, building requests there spaced
  the messages' receipts by a few milliseconds each);
- the message is acked once ``run_job`` returns, that is once the job's final state is stored
  (or it was handed back, or it was not ours to run): acks late, as the app says.

With two keys or more no key may hold more than the ordinary lanes' slots of a worker
(``key_slots``): the prefetch window has a reserve lane's batch more (worker/app.py), so a
flood cannot fill it, and another key's task is fetched at once (worker/engine/fair_share.py).
A key served more tokens than another key at work here (``worker.fairness.token_shares``)
waits for it. A key at either limit is held back as ``max_running_jobs`` holds it
(``worker.fairness.key_caps``, ``worker.fairness.key_holds``).

Leases, not the broker, decide who runs a job: a redelivered task whose job is ``running`` under
a live lease (or already finished) is not claimed, only acked. The dispatcher and the runtime
belong to the worker's ``TrickleWorker`` bootstep (worker/app.py); nothing here is global.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from celery.worker import state as worker_state
from celery.worker.consumer import Consumer
from celery.worker.request import Request

from trickle.queue import tenant_queues
from worker.fairness.key_caps import KeyCaps
from worker.fairness.key_holds import QueueSwitches, queue_switches
from worker.fairness.token_shares import TokenShares

log = logging.getLogger(__name__)

# (job id, its claim or None to claim its own) -> returns once the job's final state is stored.
RunJob = Callable[[str, Any], None]
ClaimMany = Callable[[list[str]], Sequence[Any]]
# Builds and reserves the request of a received message; None when it is not to run (revoked).
Reserve = Callable[[], Request | None]
# How often jobs held under their key's max_running_jobs try again (besides each local end).
HOLD_RETRY_SECONDS = 0.25


class JobDispatcher:
    """Claims the requests the consumer hands it, many per round trip, and runs each in a job
    thread; acks each once its job has ended."""

    def __init__(
        self,
        run_job: RunJob,
        claim_many: ClaimMany,
        slots: int,
        caps: KeyCaps | None = None,
        key_slots: int = 0,
        shares: TokenShares | None = None,
    ):
        """``key_slots``: the most jobs one key may run here at once (0: no limit);
        ``shares``: the keys' token counters (None: keys take turns only)."""
        self._run_job = run_job
        self._claim_many = claim_many
        self.caps = caps
        self.key_slots = key_slots
        self.shares = shares
        self.switches = QueueSwitches()
        self._per_key: Counter[str] = Counter()  # jobs admitted and not yet ended, by key
        self._intake: deque[tuple[Reserve, str]] = deque()
        # Requests over their key's max_running_jobs, by key: unacked, waiting to be claimed.
        self._held: dict[str, list[Request]] = {}
        self._held_count = 0
        self._retry_held = False
        self._joining = False
        self._lock = threading.Condition()
        self._busy = 0
        self._stopping = False
        self._jobs = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="trickle-job")
        self._claimer = threading.Thread(target=self._claim_loop, name="trickle-claim", daemon=True)

    def start(self) -> None:
        self._claimer.start()

    def submit(self, reserve: Reserve, tenant: str = "") -> None:
        """From Celery's consumer thread: take a received message; ``tenant``: the key whose
        queue it came from.

        On an idle worker (nothing claimed, received or held) the one message is claimed right
        here, on the consumer's thread: a lone job then spares the wake-up of the claim thread
        on its way to a first token (the consumer waits the claim's round trip, with nothing
        else to read). Otherwise it goes to the claim thread, which claims everything received
        meanwhile in one round trip while the consumer reads on (a burst)."""
        with self._lock:
            self._busy += 1
            inline = self._busy == 1 and not self._stopping and not self.holds_keys
            if not inline:
                self._intake.append((reserve, tenant))
                self._lock.notify_all()
                return
        self._take([(reserve, tenant)])

    def stop_taking(self) -> None:
        """Warm shutdown: claim nothing more; requests not yet claimed stay unacked, so the
        broker gives them to another worker."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for every claimed job to end (stored or handed back)."""
        with self._lock:
            self._joining = True
            ended = self._lock.wait_for(
                lambda: self._busy <= len(self._intake) + self._held_count, timeout
            )
        self._jobs.shutdown(wait=ended)
        return ended

    def _claim_loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(
                    lambda: self._intake or self._stopping or self._retry_held,
                    HOLD_RETRY_SECONDS if self._held else None,
                )
                if self._stopping:
                    return
                received = list(self._intake)
                self._intake.clear()
                self._retry_held = False
            self._take(received)

    def _take(self, received: list[tuple[Reserve, str]]) -> None:
        """Build the received messages' requests, claim the ones that may start in one round
        trip, and give each to a job thread."""
        reserved = [(reserve(), tenant) for reserve, tenant in received]
        taken = [(request, tenant) for request, tenant in reserved if request]
        if len(taken) < len(received):
            self._ended(len(received) - len(taken))
        runnable = self._admit(taken) if self.holds_keys else taken
        if not runnable:
            return
        claims = self._claims([job_id_of(request) for request, _ in runnable])
        for (request, tenant), claim in zip(runnable, claims, strict=True):
            if self.shares is not None:
                self.shares.started(tenant, job_id_of(request), claim)
            request.on_accepted(os.getpid(), time.monotonic())  # active, counted, "started"
            self._jobs.submit(self._run, request, claim, tenant)

    @property
    def held_count(self) -> int:
        """Requests held now (each one widened the prefetch window)."""
        with self._lock:
            return self._held_count

    @property
    def holds_keys(self) -> bool:
        """Whether a key's jobs may be held back here (a running cap, ``key_slots``, or its
        token share)."""
        return self.caps is not None or self.key_slots > 0 or self.shares is not None

    def _admit(self, taken: list[tuple[Request, str]]) -> list[tuple[Request, str]]:
        """The requests that may start, each key's held ones first: within its share of this
        worker and its running cap; the rest are held, and their key's queues paused here."""
        switches = self.switches
        runnable: list[tuple[Request, str]] = []
        waiting = {tenant: list(requests) for tenant, requests in self._held.items()}
        with self._lock:
            at_work = {tenant for tenant, count in self._per_key.items() if count > 0}
        at_work |= set(self._held)
        for request, tenant in taken:
            if self.shares is not None:
                self.shares.arriving(tenant, at_work)
            waiting.setdefault(tenant, []).append(request)
        order = self.shares.order(waiting) if self.shares is not None else list(waiting)
        for tenant in order:
            requests = waiting[tenant]
            before = len(self._held.get(tenant, ()))
            admitted = self._admissible(tenant, [job_id_of(request) for request in requests])
            keep = [request for request in requests if job_id_of(request) not in admitted]
            started = [(r, tenant) for r in requests if job_id_of(r) in admitted]
            runnable += started
            with self._lock:
                self._per_key[tenant] += len(started)
            switches.hold(len(keep) - before)
            if keep:
                self._held[tenant] = keep
                if not before:
                    switches.pause(tenant)
            else:
                self._held.pop(tenant, None)
                if before:
                    switches.resume(tenant)
        with self._lock:
            self._held_count = sum(len(requests) for requests in self._held.values())
        return runnable

    def _admissible(self, tenant: str, job_ids: list[str]) -> set[str]:
        """Of a key's waiting jobs (in order), those that may start now."""
        if self.shares is not None and self.shares.must_wait(tenant, *self._rivals(tenant)):
            return set()
        if self.key_slots:
            with self._lock:
                room = max(self.key_slots - self._per_key[tenant], 0)
            job_ids = job_ids[:room]
        if not job_ids or self.caps is None or not self.caps.capped(tenant):
            return set(job_ids)
        try:
            return self.caps.take(tenant, job_ids)
        except redis.RedisError:
            log.exception("key %s: running-job cap unreadable; its jobs start", tenant)
            return set(job_ids)

    def _rivals(self, tenant: str) -> tuple[list[str], set[str]]:
        """The other keys at work here that could take the engine rows ``tenant``'s job would,
        and those of them with jobs held here. A key held at its ``max_running_jobs`` is no
        rival (waiting for it could leave rows idle); one held at ``key_slots`` is (its jobs
        here fill the lanes)."""
        capped = self.caps.capped if self.caps is not None else (lambda _: False)
        with self._lock:
            rivals = [
                other
                for other, count in self._per_key.items()
                if count > 0 and other != tenant and not (other in self._held and capped(other))
            ]
        return rivals, set(self._held)

    def _claims(self, job_ids: list[str]) -> Sequence[Any]:
        try:
            return self._claim_many(job_ids)
        except Exception:  # Redis away, or worse: never the end of the consumer or claim thread
            log.exception("claiming %d jobs at once failed; each claims its own", len(job_ids))
            return [None] * len(job_ids)

    def _run(self, request: Request, claim: Any, tenant: str = "") -> None:
        started = time.monotonic()
        job_id = job_id_of(request)
        succeeded = False
        try:
            self._run_job(job_id, claim)  # None: the job thread claims its own job
            succeeded = True
            request.send_event("task-succeeded", result=None, runtime=time.monotonic() - started)
        except Exception as exc:  # the edge of a job thread: the lease sweep takes the job over
            log.exception("job %s: run_job failed", job_id)
            request.send_event("task-failed", exception=repr(exc), traceback="")
        finally:
            request.acknowledge()
            worker_state.task_ready(request, successful=succeeded)
            if self.caps and self.caps.capped(tenant) and getattr(claim, "claimed", True):
                self.caps.release(tenant, job_id)
            if self.shares is not None:
                self.shares.ended(job_id, claim)
            if self.holds_keys:
                with self._lock:
                    self._per_key[tenant] -= 1
                    # Even with nothing held yet: the claim thread may be holding one now.
                    self._retry_held = True
            self._ended(1)

    def _ended(self, count: int) -> None:
        with self._lock:
            self._busy -= count
            # Only a join (shutdown) waits on the count, and the claim thread on held jobs'
            # retry: waking the idle claim thread on every job's end would be a wasted switch.
            if self._joining or self._retry_held:
                self._lock.notify_all()


def _ack(message: Any, logger: Any, errors: Any) -> None:
    """Ack on the consumer's thread (``call_soon_ack``, as Celery's own acks). A message from a
    connection lost since (a broker restart) cannot be acked any more, and kombu raised
    AttributeError out of the event loop for it: it stays in kombu's unacked hash and comes
    back after the visibility timeout, where its finished job makes it a no-op."""
    try:
        message.ack_log_error(logger, errors)
    except AttributeError:
        log.warning("task %s came from a lost broker connection; not acked", message.delivery_tag)


def job_id_of(request: Request) -> str:
    """The job id a ``trickle.generate`` request carries (its one argument)."""
    (job_id,) = request.args
    if not isinstance(job_id, str):
        raise TypeError(f"trickle.generate takes a job id, not {job_id!r}")
    return job_id


def generate_strategy(task: Any, app: Any, consumer: Any, **_: Any) -> Callable[..., None]:
    """The task strategy of ``trickle.generate`` (``Task.Strategy``): what Celery's default
    strategy does for a plain task (request, revoked check, events, reservation), then the
    request goes to the worker's dispatcher instead of the pool."""
    hostname = consumer.hostname
    eventer = consumer.event_dispatcher
    send_received = bool(eventer and eventer.enabled and task.send_events)
    connection_errors = consumer.connection_errors
    revoked = consumer.controller.state.revoked
    dispatcher: JobDispatcher = consumer.controller.trickle.dispatcher
    queues = tenant_queues(app)
    if dispatcher.holds_keys:
        dispatcher.switches = queue_switches(consumer, queues)
        held = dispatcher.held_count
        if held:  # a consumer restart builds a new window without the earlier widening
            consumer.call_soon(lambda: consumer.qos.increment_eventually(held))

    def reserve(message: Any, ack: Any, reject: Any, callbacks: Any) -> Request | None:
        on_ack = functools.partial(consumer.call_soon_ack, _ack, message)
        try:
            request = Request(
                message,
                on_ack=on_ack,
                on_reject=reject,
                app=app,
                hostname=hostname,
                eventer=eventer,
                task=task,
                connection_errors=connection_errors,
                body=message.body,
                headers=message.headers,
                decoded=False,
                utc=True,
            )
            job_id_of(request)
        except Exception:  # no worker could ever run it: drop it, loudly, not forever again
            log.exception("dropped a trickle.generate message that names no job")
            on_ack(log, connection_errors)
            return None
        if (request.expires or request.id in revoked) and request.revoked():
            return None
        if send_received:
            request.send_event(
                "task-received",
                name=request.name,
                args=request.argsrepr,
                kwargs=request.kwargsrepr,
                root_id=request.root_id,
                parent_id=request.parent_id,
                retries=request.request_dict.get("retries", 0),
            )
        worker_state.task_reserved(request)
        for callback in callbacks or ():
            callback(request)
        return request

    def on_generate_message(
        message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **_: Any
    ) -> None:
        tenant = queues.tenant_of(message.delivery_info.get("routing_key") or "")
        dispatcher.submit(functools.partial(reserve, message, ack, reject, callbacks), tenant)

    return on_generate_message


class TrickleConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer (``worker_consumer``), surviving a broker restart with unacked tasks.

    When the connection to a Redis broker is lost, Celery collects the connection (the
    transport lets go of its client) and then closes it; the close restores the channel's
    unacknowledged messages, which needs that client: with any task in flight (every running
    job, acked late) it raised ``AttributeError`` out of the error handler, and the worker
    stopped ("Unrecoverable error"). Here the error is logged and the reconnect goes on; the
    messages stay in kombu's unacked hash, and come back after the visibility timeout, where
    the lease makes a redelivered task of a running or finished job a no-op.
    """

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError:
            log.warning("broker connection lost with tasks in flight; reconnecting", exc_info=True)
