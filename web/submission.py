"""Turning a validated request into a queued job: the one path every API takes to the workers."""

from __future__ import annotations

import json
import time
from typing import Any

from flask import request

from web.auth import current_owner
from web.errors import invalid, too_many, unavailable
from web.services import Services
from web.validation import check_prompt_length
from worker.jobs import GenerationParams, Job, Usage, new_job_id
from worker.metric_defs import JOBS
from worker.metrics import count_now
from worker.queueing import enqueue_generation, queued_messages
from worker.store import CancelOutcome

QUEUE_FULL_RETRY_AFTER_SECONDS = 5


def read_json_body() -> Any:
    """The request body as JSON; bad UTF-8 or syntax is a 400 naming the body."""
    raw = request.get_data(cache=False)
    if not raw:
        raise invalid("body", "request body must be a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid("body", f"request body is not valid UTF-8 (byte {exc.start})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid("body", f"request body is not valid JSON: {exc}") from exc


def count_prompt_tokens(svc: Services, model: str, prompt: str) -> int:
    try:
        tokenizer = svc.tokenizer(model)
    except ValueError as exc:
        raise unavailable(f"model {model!r} is not available: {exc}") from exc
    return tokenizer.count(prompt)


def prepare_job(svc: Services, model: str, prompt: str, params: GenerationParams) -> Job:
    """Check the prompt against the limits and build the job (not stored yet)."""
    prompt_tokens = count_prompt_tokens(svc, model, prompt)
    check_prompt_length(prompt_tokens, params, svc.settings, model)
    return Job(
        id=new_job_id(),
        model=model,
        prompt=prompt,
        params=params,
        usage=Usage(prompt_tokens=prompt_tokens),
        created_at=time.time(),
        owner=current_owner(),
    )


def admit(svc: Services, jobs: list[Job]) -> None:
    """Rate limits, then queue capacity: 429 before anything is stored."""
    svc.rate_limiter.admit(sum(j.usage.prompt_tokens + j.params.max_tokens for j in jobs))
    check_queue_capacity(svc, jobs[0].model, adding=len(jobs))


def check_queue_capacity(svc: Services, model: str, adding: int = 1) -> None:
    """429 once a model's queue holds max_queued_jobs (every priority): better a retry than an
    endless wait."""
    waiting = queued_messages(svc.redis, model)
    limit = svc.settings.limits.max_queued_jobs
    if waiting + adding > limit:
        raise too_many(
            "queue_full",
            f"model {model!r} has {waiting} jobs waiting (limit {limit}); retry later",
            QUEUE_FULL_RETRY_AFTER_SECONDS,
        )


def cancel(svc: Services, job_id: str, model: str) -> CancelOutcome:
    """Cancel a job; one still queued ends here, so it is counted here (workers count the rest)."""
    outcome = svc.store.cancel(job_id, time.time())
    if outcome is CancelOutcome.CANCELED:
        count_now(svc.redis, JOBS, model=model, status="canceled")
    return outcome


def enqueue(svc: Services, job: Job) -> None:
    """Record the job, then hand its id to the model's queue."""
    svc.store.create(job)
    enqueue_generation(svc.celery, job.id, job.model, job.priority)
