"""Everything one worker process holds: Redis, the publisher, and a loaded engine per model.

Built once per process (models are loaded once, by the worker's TrickleWorker bootstep) and used
by every job thread of its dispatcher. A job is
run under a lease (see ``Leases.claim``): the fence travels with every write, so a worker that
lost its lease can never write over the one that took the job over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from trickle import keys
from trickle.capacity import slots_per_worker
from trickle.config.settings import Settings
from trickle.events import TokenEvent
from trickle.job_result import JobResult
from trickle.joblog import log_job_event
from trickle.jobs import FinishReason, Job, JobError, context_overflow
from trickle.store.job_store import JobStore
from trickle.store.leases import Claim, ClaimOutcome, ReleaseOutcome
from trickle.store.redis_connection import connect
from trickle.telemetry.metric_defs import JOBS, QUEUE_TIME
from trickle.telemetry.metrics import MetricsRecorder
from trickle.telemetry.tracing import JobTimeline, Tracing
from trickle.tenants import TenantTable, tenant_label
from worker.accounting import account_finished
from worker.coldstart import ColdStart
from worker.decode_rates import DecodeRates
from worker.engine.engine import Engine
from worker.engine.new_job import Resume, make_scheduled_job
from worker.engine.prefix import cache_partition
from worker.engine.scheduler import ScheduledJob
from worker.in_flight import InFlight
from worker.job_outcome import ended_result
from worker.job_trace import logged_hop_seconds, record_job_trace
from worker.maintenance import LEASE_LOST, Maintenance, WorkerDuties
from worker.model_loading import load_models
from worker.outlook import worker_outlooks
from worker.publisher import TokenPublisher
from worker.retry import with_redis_retry

log = logging.getLogger(__name__)


@dataclass
class Begun:
    """A claimed job the claim thread already gave its engine (``claim_and_start``), or whose
    start failed with ``error`` (its job thread stores the failure)."""

    claim: Claim
    timeline: JobTimeline
    scheduled: ScheduledJob | None = None
    error: ValueError | None = None


# (job id, model, priority) -> put the job id on the model's queue again.
# (job id, model, priority, tenant: its key digest, which picks its key's queue)
Enqueue = Callable[[str, str, int, str], None]


class WorkerRuntime:
    def __init__(
        self,
        settings: Settings,
        enqueue: Enqueue,
        node_name: str = "worker",
        notify: Callable[[str], None] | None = None,
        tracing: Tracing | None = None,
        queue_depth: Callable[[str], int] | None = None,
    ):
        self.settings = settings
        self.tenants = TenantTable(settings.tenants)
        self.tracing = tracing or Tracing.disabled()
        self.node_name = node_name
        self.redis = connect(settings.redis)
        self.store = JobStore(
            self.redis, settings.limits.result_ttl_seconds, settings.limits.queued_ttl_seconds
        )
        self._enqueue = enqueue
        self._notify = notify or (lambda job_id: None)
        self.metrics = MetricsRecorder()
        self.in_flight = InFlight()
        self.cold_start = ColdStart()
        self.publisher = TokenPublisher.paced_as(
            settings.tuning,
            self.store,
            self._cancel_requested,
            self.lease_lost,
            self.in_flight.first_published if self.tracing.enabled else None,
        )
        self.engines, self.schedulers = load_models(
            settings, self.publisher.publish_step, self.metrics, self.cold_start
        )
        self.decode_rates = {model: DecodeRates() for model in self.engines}
        self.duties = WorkerDuties(
            settings,
            node_name,
            tuple(self.engines),
            self.redis,
            self.store,
            self.metrics,
            self.in_flight,
            self.slot_usage,
            self.requeue,
            queue_depth or (lambda model: 0),
            self.lease_lost,
            self.publisher.recheck_finished,
            outlooks=lambda: worker_outlooks(
                self.in_flight, self.engines, self.schedulers, self.decode_rates
            ),
        )
        self.maintenance = Maintenance(self.duties)

    @property
    def lease_ms(self) -> int:
        return self.duties.lease_ms

    def start(self) -> None:
        """Heartbeats, lease renewal and the orphan sweep start once the worker is ready."""
        self.cold_start.ready()
        self.maintenance.start()

    def slot_usage(self) -> dict[str, tuple[int, int]]:
        """(busy, total) task slots per served model, for the autoscaler (see capacity)."""
        running = self.in_flight.running_models()
        usage = {}
        for name, engine in self.engines.items():
            total = slots_per_worker(engine.settings)
            # Jobs on the reserve lane (keys sharing slots) are not counted past the lanes' slots.
            usage[name] = (min(running.count(name), total), total)
        return usage

    def requeue(self, job_id: str) -> str:
        """Put a recovered job back on its model's queue, at its priority; returns the model."""
        model, priority, tenant_digest = self.redis.hmget(
            keys.job(job_id), ["model", "priority", "tenant_digest"]
        )
        if model:
            self._enqueue(job_id, str(model), int(priority or 0), str(tenant_digest or ""))
        return str(model or "unknown")

    def hand_back_pending(self) -> int:
        """Graceful shutdown: jobs not yet in a batch go back to the queue, uncounted."""
        handed = 0
        for scheduler in self.schedulers.values():
            for job in scheduler.take_pending():
                try:
                    released = self.store.leases.release(job.job_id, job.fence, time.time())
                    if released is ReleaseOutcome.QUEUED:
                        self.requeue(job.job_id)  # on its key's queue
                        handed += 1
                except redis.RedisError as exc:
                    log.warning("hand back %s failed (%s); its lease will lapse", job.job_id, exc)
                job.handed_back = True
                job.ended.set()
        return handed

    def close(self) -> None:
        self.maintenance.stop()
        for scheduler in self.schedulers.values():
            scheduler.close()
        self.publisher.close()
        for engine in self.engines.values():
            engine.close()
        self.maintenance.withdraw()

    def claim_many(self, job_ids: list[str]) -> list[Claim]:
        """Claims for the jobs the dispatcher took at once, in one round trip (no retry here: on
        an error the dispatcher leaves each job to claim itself in ``run_job``, which retries)."""
        max_attempts = self.settings.worker.max_attempts
        now = time.time()
        return self.store.leases.claim_many(
            job_ids, self.node_name, now, self.lease_ms, max_attempts
        )

    def claim_and_start(self, job_ids: list[str]) -> list[Claim | Begun]:
        """``claim_many``, then, on the same (claim) thread, each fresh claimed job goes to its
        engine at once: its lane starts while its job thread is still waking, so neither that
        hop nor the job thread's logging and metrics stand before a lone job's first token. A
        resumed job (its replay log must be read first) or one whose start needs Redis and found
        it away is left to its job thread."""
        claim_started = time.time()
        claims = self.claim_many(job_ids)
        claimed_at = time.time()
        begun = [self._begin(claim, claim_started, claimed_at) for claim in claims]
        self.in_flight.claims_seen(claimed_at)  # after every fresh job was added
        return begun

    def _begin(self, claim: Claim, claim_started: float, claimed_at: float) -> Claim | Begun:
        job = claim.job
        if not claim.claimed or job is None or claim.logged_tokens:
            return claim
        if job.deadline is not None and claimed_at > job.deadline:
            return claim  # its job thread ends it, expired
        timeline = JobTimeline(claim_started=claim_started, claimed=claimed_at)
        try:
            scheduled = self._schedule(job, [], claim)
        except ValueError as exc:  # fails in its job thread, which stores that
            return Begun(claim, timeline, error=exc)
        except redis.RedisError:  # nothing was scheduled: the job thread retries it all
            return claim
        except Exception:  # never the claim thread's end: the job thread meets it again
            log.exception("starting job %s on the claim thread failed", job.id)
            return claim
        timeline.scheduled = time.time()
        return Begun(claim, timeline, scheduled)

    def run_job(self, job_id: str, claim: Claim | Begun | None = None) -> None:
        """Claim (unless ``claim`` is given), generate and store one job; returns once its
        final state is in Redis. ``claim`` may be a job ``claim_and_start`` already started."""
        retry = self.settings.worker.redis_retry_seconds
        begun: Begun | None = None
        if isinstance(claim, Begun):
            begun, claim = claim, claim.claim
        timeline = begun.timeline if begun else JobTimeline(claim_started=time.time())
        claimed_here = claim is None
        if claim is None:
            (claim,) = with_redis_retry(lambda: self.claim_many([job_id]), retry, f"claim {job_id}")
        if not claim.claimed:
            log.info("job %s not run: %s", job_id, claim.outcome.value)
            if claim.outcome is ClaimOutcome.POISONED:
                self.metrics.count(JOBS, model=self.store.model_of(job_id), status="failed")
            return
        if begun is None:
            timeline.claimed = time.time()
        job = claim.job
        if job is None:
            return
        if job.deadline is not None and timeline.claimed > job.deadline and not claim.logged_tokens:
            log_job_event(
                "expired", job.id, job.model, late_seconds=timeline.claimed - job.deadline
            )
            self._finish(job, claim, JobResult.expired(timeline.claimed))
            return
        events: list[TokenEvent] = []
        if claim.logged_tokens:  # it ran before: resume after what was already streamed
            events = with_redis_retry(lambda: self.store.tokens(job_id), retry, job_id)
        error = begun.error if begun else None
        scheduled = begun.scheduled if begun else None
        if begun is None:
            try:
                scheduled = with_redis_retry(
                    lambda: self._schedule(job, events, claim), retry, job_id
                )
            except ValueError as exc:
                error = exc
            timeline.scheduled = time.time()
            if claimed_here and not events:  # the claim thread's claims say so themselves
                self.in_flight.claims_seen(timeline.claimed)
        self._note_claimed(job, claim, resumed=len(events))
        if error is not None or scheduled is None:
            failure = JobError("invalid_request", str(error))
            self._finish(job, claim, JobResult.failed(failure, "", 0))
            return
        scheduled.ended.wait()
        # The job stays in flight until its final state is stored: its first tokens' flush can
        # land after its last step (a short job), and the publisher notes that moment on the
        # job in flight (a job already removed lost its "first publish" hop).
        try:
            self._conclude(job, claim, scheduled, timeline, resumed=len(events))
        finally:
            self.in_flight.remove(job_id)

    def _note_claimed(self, job: Job, claim: Claim, resumed: int) -> None:
        """Count and log a claim: after its engine has it, where none of this delays it."""
        self.cold_start.first_claim(job.model, job.created_at, self.metrics)
        queued = (job.started_at or time.time()) - job.created_at
        if claim.attempt == 1:
            self.metrics.observe(QUEUE_TIME, queued, model=job.model)
        log_job_event(
            "claimed",
            job.id,
            job.model,
            worker=self.node_name,
            attempt=claim.attempt,
            queue_seconds=queued,
            resumed_tokens=resumed,
        )

    def _conclude(
        self,
        job: Job,
        claim: Claim,
        scheduled: ScheduledJob,
        timeline: JobTimeline,
        resumed: int,
    ) -> None:
        """Store the final state of a job whose generation ended, and record its trace."""
        state = scheduled.state
        if scheduled.handed_back or state.error is LEASE_LOST:
            log_job_event("released", job.id, job.model, handed_back=scheduled.handed_back)
            self.publisher.forget(job.id)
            return
        result = ended_result(job, scheduled, timeline.claimed)
        timeline.batch_started = scheduled.batch_started_at
        timeline.first_token = scheduled.first_token_at
        timeline.first_published = scheduled.first_published_at
        timeline.last_token = scheduled.last_token_at
        self._finish(job, claim, result, scheduled, resumed=resumed, timeline=timeline)
        if job.trace_context and self.tracing.enabled:
            record_job_trace(self.tracing, job, result, timeline, claim.attempt)

    def _finish(
        self,
        job: Job,
        claim: Claim,
        result: JobResult,
        scheduled: ScheduledJob | None = None,
        resumed: int = 0,
        timeline: JobTimeline | None = None,
    ) -> None:
        """Store the final state (fenced), then account for it in metrics and the job log."""
        if result.error is not None:
            log.error("job %s failed: %s: %s", job.id, result.error.type, result.error.message)
        self.publisher.publish_finish(job.id, claim.fence, result).wait()
        if job.webhook_url:
            self._notify(job.id)
        key = tenant_label(self.tenants.name_of_digest(job.tenant_digest))
        hops = logged_hop_seconds(job, timeline) if timeline is not None else {}
        account_finished(self.metrics, job, claim.attempt, result, scheduled, resumed, key, hops)

    def _schedule(self, job: Job, events: list[TokenEvent], claim: Claim) -> ScheduledJob:
        """Build the job's engine request, resuming after whatever was already streamed."""
        engine = self.engines.get(job.model)
        if engine is None:
            raise ValueError(f"this worker does not serve model {job.model!r}")
        resume = Resume("".join(event.text for event in events), len(events))
        if resume.count == 0 and job.prompt_ids:
            prompt_ids = list(job.prompt_ids)  # tokenized once, by the web tier
        else:
            prompt_ids = engine.tokenizer.encode(job.prompt + resume.text)
        if resume.count == 0:
            self._check_context(engine, job, len(prompt_ids))
            if len(prompt_ids) != job.usage.prompt_tokens:
                self.store.set_prompt_tokens(job.id, len(prompt_ids))
        deadline = (job.started_at or time.time()) + self.settings.limits.max_job_seconds
        scheduled = make_scheduled_job(
            engine,
            job.id,
            prompt_ids,
            job.params,
            claim.fence,
            resume,
            deadline,
            job.priority,
            self.tenants.name_of_digest(job.tenant_digest),
            cache_partition(job.tenant_digest, job.params.cache_salt),
        )
        if job.deadline is not None and job.deadline < deadline:
            scheduled.deadline = job.deadline  # the client's: stopped, not failed
            scheduled.deadline_stop = (FinishReason.DEADLINE, None)
        ended = events[-1].end if events else None
        if ended is not None or resume.count >= job.params.max_tokens:
            # Its worker died after its last token but before storing the result (its claim
            # counted no attempt, store.scripts.CLAIM): finish it as it stands.
            scheduled.state.finish_without_token(ended or FinishReason.LENGTH)
            scheduled.state.stop_sequence = events[-1].stop_sequence
            scheduled.ended.set()
            return scheduled
        self.in_flight.add(scheduled, job.model)
        self.schedulers[job.model].submit(scheduled)
        return scheduled

    @staticmethod
    def _check_context(engine: Engine, job: Job, prompt_tokens: int) -> None:
        limit = engine.settings.max_context_tokens
        overflow = context_overflow(prompt_tokens, job.params.max_tokens, limit)
        if overflow:
            raise ValueError(overflow)

    def _cancel_requested(self, job_id: str) -> None:
        self._stop(job_id, FinishReason.CANCELED, None)

    def lease_lost(self, job_id: str) -> None:
        """This worker, alive, lost a job's lease: stop its copy, and say the lapse was no death
        so a starved worker's lapses never fail the job (``Leases.forgive_lapse``)."""
        fence = self.in_flight.fence_of(job_id)
        log.warning("job %s: lease lost; stopping this copy", job_id)
        self._stop(job_id, FinishReason.ERROR, LEASE_LOST)
        if fence is None:
            return
        try:
            self.store.leases.forgive_lapse(job_id, fence, self.settings.worker.max_attempts)
        except redis.RedisError as exc:  # the lapse then counts as a death: the old rule
            log.warning("job %s: could not report its lapse (%s)", job_id, exc)

    def _stop(self, job_id: str, reason: FinishReason, error: JobError | None) -> None:
        self.in_flight.stop(job_id, reason, error)
