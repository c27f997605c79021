"""Turning a validated request into a queued job: the one path every API takes to the workers."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from gevent import get_hub, monkey

from trickle.jobs import Job, Usage, new_job_id
from trickle.params import GenerationParams
from trickle.queue import BROKER_ERRORS, enqueue_generation, publishing_into
from trickle.store.job_store import CancelOutcome
from trickle.telemetry.metric_defs import JOBS
from trickle.telemetry.metrics import count_now
from web.admission.auth import current_key, current_tenant_digest
from web.admission.idempotency import Created, IdempotencyKey, matching, ttl_seconds
from web.admission.key_policy import check_key_policy
from web.common.arrival import arrival_time
from web.common.errors import too_many, unavailable
from web.common.turns import in_turns
from web.common.validation import check_prompt_length
from web.services import Services

log = logging.getLogger(__name__)

QUEUE_FULL_RETRY_AFTER_SECONDS = 5
T = TypeVar("T")


# Characters a prompt may have for its tokenization to run on the event loop (about 1 ms);
# a longer one (up to the body limit's megabyte, tens of ms) is tokenized on a thread.
INLINE_TOKENIZE_CHARS = 16_384


def tokenize_prompt(svc: Services, model: str, prompt: str) -> list[int]:
    """The prompt's ids. A long prompt is tokenized off the event loop (SentencePiece lets go
    of the GIL), so one request's megabyte never stalls the process's other requests."""
    try:
        tokenizer = svc.tokenizer(model)
    except ValueError as exc:
        raise unavailable(f"model {model!r} is not available: {exc}") from exc
    if len(prompt) <= INLINE_TOKENIZE_CHARS:
        return tokenizer.encode(prompt)
    return in_pool(lambda: tokenizer.encode(prompt))


def in_pool(work: Callable[[], T]) -> T:
    """``work()`` on gevent's thread pool under gevent's hub (its exception raised here), so
    the process's other requests go on meanwhile; directly elsewhere."""
    if not monkey.is_module_patched("threading"):
        return work()
    result: T = get_hub().threadpool.apply(work)
    return result


def prepare_job(
    svc: Services, model: str, prompt: str, params: GenerationParams, shard: int | None = None
) -> Job:
    """Check the prompt against the limits and build the job (not stored yet); ``shard``: the
    one its id must live in (an idempotency key's, see web.admission.idempotency).

    The prompt is tokenized here once: the ids travel with the job, so the worker skips it.
    """
    prompt_ids = tokenize_prompt(svc, model, prompt)
    params = check_prompt_length(len(prompt_ids), params, svc.settings, model)
    if params.grammar is not None:  # a new grammar's search takes ms to a second: off the loop
        budget = svc.answer_budget(model)
        in_pool(lambda: budget.check(params, model))
    return Job(
        id=new_job_id(shard),
        model=model,
        prompt=prompt,
        params=params,
        usage=Usage(prompt_tokens=len(prompt_ids)),
        created_at=time.time(),
        tenant_digest=current_tenant_digest(),
        prompt_ids=tuple(prompt_ids),
        arrived_at=arrival_time(),
    )


def admission_cost(jobs: list[Job]) -> int:
    """Tokens a submission reserves against tokens_per_minute: prompts plus max_tokens."""
    return sum(job.usage.prompt_tokens + job.params.max_tokens for job in jobs)


def tenant_of(svc: Services, job: Job) -> str:
    """The job's tenant (its tenant's key name), which picks its queue."""
    return svc.tenants.name_of_digest(job.tenant_digest)


def admit(svc: Services, jobs: list[Job]) -> None:
    """The key's policy (403), rate limits, then queue capacity (429): before anything is
    stored."""
    check_key_policy(svc, current_key(), jobs)
    svc.rate_limiter.admit(admission_cost(jobs))
    check_queue_capacity(svc, jobs[0].model, adding=len(jobs))


def check_queue_capacity(svc: Services, model: str, adding: int = 1) -> None:
    """429 once a model's interactive queue holds max_queued_jobs: better a retry than an
    endless wait. Batch jobs wait apart (``limits.max_batch_backlog``) and never count here.
    The answer names the limit, never the depth: that is every tenant's work, not the
    caller's."""
    limit = svc.settings.limits.max_queued_jobs
    waiting = svc.admission_depth.waiting(model, limit, adding)
    if waiting + adding > limit:
        raise too_many(
            "queue_full",
            f"model {model!r} has no room for {adding} more interactive job(s) "
            f"(limits.max_queued_jobs = {limit}); retry later",
            QUEUE_FULL_RETRY_AFTER_SECONDS,
        )


def cancel(svc: Services, job_id: str, model: str) -> CancelOutcome:
    return cancel_many(svc, [(job_id, model)])[0]


def cancel_many(svc: Services, jobs: list[tuple[str, str]]) -> list[CancelOutcome]:
    """Cancel jobs given as (id, model), in one round trip. The one place cancels are counted:
    a job still queued ends here, once however often it is canceled (workers count the rest)."""
    outcomes = svc.store.cancel_many([job_id for job_id, _model in jobs], time.time())
    canceled = Counter(
        model
        for (_job_id, model), outcome in zip(jobs, outcomes, strict=True)
        if outcome is CancelOutcome.CANCELED
    )
    for model, amount in canceled.items():
        count_now(svc.redis, JOBS, amount, model=model, status="canceled")
    return outcomes


def cancel_quietly(svc: Services, jobs: list[tuple[str, str]]) -> None:
    """``cancel_many`` where the request answers whatever becomes of the cancel (its wait ran
    out, its client left, a response canceled or deleted): Redis being away is only logged."""
    if not jobs:
        return
    try:
        cancel_many(svc, jobs)
    except redis.RedisError as exc:
        log.warning("could not cancel %s: %s", ", ".join(job_id for job_id, _ in jobs), exc)


def enqueue(svc: Services, job: Job, key: IdempotencyKey | None = None) -> Created | None:
    """``enqueue_all`` for one job."""
    return enqueue_all(svc, [job], key)


def enqueue_all(
    svc: Services, jobs: list[Job], key: IdempotencyKey | None = None
) -> Created | None:
    """Record the jobs (one round trip; with ``key``, in one script with the idempotency key),
    then publish their tasks through Celery (``send_task``). Returns what an earlier request
    with the same key created instead, when there was one (nothing is created then).

    Where the broker is the job store's own Redis (the default), Celery builds each task
    message and kombu's publish queues its LPUSH in the records' transaction (or script): one
    round trip, and a record never exists without its task nor a task without its record.

    Elsewhere the records go first, so a worker never takes a task whose job it cannot read.
    Should the first publish fail (the broker is down), the records are taken back and the
    caller gets a 503 that says nothing was created. Should a later one fail, the 503 names the
    jobs: they exist (the workers' sweep publishes the ones not sent again, see
    ``Maintenance.republish``).
    """
    if svc.tasks_ride_with_records:
        return _record_with_tasks(svc, jobs, key)
    earlier = _record(svc, jobs, key)
    if earlier is not None:
        return earlier
    sent: list[Job] = []
    try:
        _publish(svc, jobs, sent)
    except BROKER_ERRORS as exc:
        if sent:
            raise unavailable(
                f"job queue (broker) unavailable after {len(sent)} of {len(jobs)} jobs: {exc}",
                [job.id for job in jobs],
            ) from exc
        _withdraw(svc, jobs, exc, key)
        raise unavailable(f"job queue (broker) unavailable, no job was created: {exc}") from exc
    return None


def _record_with_tasks(
    svc: Services, jobs: list[Job], key: IdempotencyKey | None
) -> Created | None:
    """The records and their task messages in one transaction (or one script with ``key``)."""

    def publish_into(pipe: Any) -> None:
        with svc.celery.producer_or_acquire() as producer, publishing_into(producer, pipe):
            _publish(svc, jobs, [], producer, declare=False)  # an LPUSH on kombu's Redis

    try:
        return _record(svc, jobs, key, also=publish_into)
    except BROKER_ERRORS as exc:  # before the transaction was sent: nothing was written
        raise unavailable(f"job queue (Redis) unavailable, no job was created: {exc}") from exc
    # A RedisError from the transaction itself goes to the app's 503 (web/common/errors.py), which
    # claims nothing: a reply lost after EXEC may leave the jobs created.


def _record(
    svc: Services,
    jobs: list[Job],
    key: IdempotencyKey | None,
    also: Callable[[Any], object] | None = None,
) -> Created | None:
    """Write the jobs' records (one round trip; with ``key``, only if the key is new, in one
    script with it); ``also`` queues more writes on the same transaction or script. Returns
    what an earlier request with the same key created, when there was one."""
    if key is None:
        svc.store.create_many(jobs, also=also)
        return None
    record = Created(key.fingerprint, [job.id for job in jobs]).to_json()
    raw = svc.store.create_jobs_once(key.redis_key, record, ttl_seconds(svc), jobs, also=also)
    return None if raw is None else matching(key, raw)


def enqueue_many(
    svc: Services,
    jobs: list[Job],
    recorded: bool = False,
    on_sent: Callable[[], None] | None = None,
) -> None:
    """``enqueue`` for a batch's jobs: every record at once (one round trip; ``recorded``: the
    caller wrote them already), then the ids to the queues in the background, so thousands of
    jobs are accepted in about a second.

    Until its task is sent a job reads ``queued`` like any other. Should the broker fail or
    this process die first, the workers' sweep publishes the jobs not yet sent again
    (``worker.republish_after_seconds``): late, but never lost. ``on_sent`` is called once
    the fan-out ends (every message sent, or the broker failed).
    """
    if not recorded:
        svc.store.create_many(in_turns(jobs))
    threading.Thread(
        target=_send_all, args=(svc, jobs, on_sent), name="trickle-batch-fanout", daemon=True
    ).start()


def _withdraw(
    svc: Services, jobs: list[Job], cause: Exception, key: IdempotencyKey | None = None
) -> None:
    try:
        svc.store.delete_unpublished([job.id for job in jobs], key.redis_key if key else "")
    except redis.RedisError:  # left queued: the workers' sweep publishes it again
        log.exception("could not withdraw %d unpublished job(s) after %s", len(jobs), cause)


def _publish(
    svc: Services, jobs: list[Job], sent: list[Job], producer: Any = None, declare: bool = True
) -> None:
    """Publish every job's task through one producer, adding each to ``sent`` once it is."""
    with svc.celery.producer_or_acquire(producer) as producer:
        for job in in_turns(jobs):  # a batch's fan-out shares the event loop with requests
            enqueue_generation(
                svc.celery, job.id, job.model, job.priority, producer, tenant_of(svc, job), declare
            )
            sent.append(job)


def _send_all(svc: Services, jobs: list[Job], on_sent: Callable[[], None] | None) -> None:
    sent: list[Job] = []
    try:
        _publish(svc, jobs, sent)
    except Exception:  # the edge of a background thread: nobody else would see it
        log.exception("batch fan-out stopped after %d of %d jobs", len(sent), len(jobs))
    finally:
        if on_sent is not None:
            on_sent()
