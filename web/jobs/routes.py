"""Submit, read and cancel jobs (``/v1/jobs``)."""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from flask import Blueprint, Response, jsonify, request

from trickle.jobs import Job, JobStatus
from web.admission.auth import current_tenant_digest
from web.admission.deadline import with_deadline
from web.admission.idempotency import earlier, requested_key
from web.admission.submission import admit, cancel, enqueue, prepare_job
from web.common.body import read_json_body
from web.common.errors import HttpError, not_found
from web.common.server_timing import with_server_timing
from web.common.validation import parse_job_request, parse_wait
from web.services import services
from web.streams.access import with_urls
from web.streams.follow import owned_by
from web.streams.job_wait import wait_for_job
from web.streams.routes import queued_fields

log = logging.getLogger(__name__)
blueprint = Blueprint("jobs", __name__)
# On a 202 whose Prefer: wait was cut short (Redis went away after the job was created).
WAIT_INTERRUPTED = "Trickle-Wait-Interrupted"


@blueprint.post("/v1/jobs")
def submit_job() -> Response:
    svc = services()
    with svc.tracing.request("POST /v1/jobs") as trace:
        with trace.step("validate"):
            wait = parse_wait(request.headers.get("Prefer"), svc.settings.web.max_wait_seconds)
            body = read_json_body()
            key = requested_key(body)
            job_request = parse_job_request(body, svc.settings, svc.requests.job)
        first = earlier(svc, key)
        if first is None:
            with trace.step("validate"):
                shard = key.shard if key else None
                job = prepare_job(
                    svc, job_request.model, job_request.prompt, job_request.params, shard
                )
                job.webhook_url = job_request.webhook_url
                job.trace_context = trace.traceparent
                with_deadline([job], job_request.deadline)
            admit(svc, [job])
            with trace.step("enqueue"):
                first = enqueue(svc, job, key)
        if first is not None:  # a retry: the first request's job, whatever its state
            job = visible_job(first.job_ids[0])
    headers = {"Location": f"/v1/jobs/{job.id}"}
    current = None
    if wait > 0:
        try:
            current = wait_for_job(svc.store, svc.hub, job.id, wait)
        except redis.RedisError as exc:  # the job exists: say so, never a 5xx that hides it
            log.warning("wait for %s cut short: redis unavailable: %s", job.id, exc)
            headers[WAIT_INTERRUPTED] = f"job store (Redis) unavailable: {exc}"[:200]
    return job_response(current or job, headers=headers, delivered=current is not None)


@blueprint.get("/v1/jobs/<job_id>")
def get_job(job_id: str) -> Response:
    svc = services()
    wait = parse_wait(request.headers.get("Prefer"), svc.settings.web.max_wait_seconds)
    if wait > 0:
        # A waiter reads the job once, at the end; until then only the tenant and the status.
        tenant_digest = svc.store.tenant_digest(job_id)
        if tenant_digest is None or not owned_by(tenant_digest, current_tenant_digest()):
            raise missing(job_id)
        job = wait_for_job(svc.store, svc.hub, job_id, wait)
        if job is None:
            raise missing(job_id)
    else:
        job = visible_job(job_id)
        # Past its deadline, still queued: no worker may be alive to end it, so this read does.
        if job.status is JobStatus.QUEUED and svc.store.deadlines.expire_late(
            job.id, job.deadline, time.time()
        ):
            job = visible_job(job_id)
    return job_response(
        job, finished_status=200, running_status=200, delivered=wait > 0, waiting=True
    )


@blueprint.post("/v1/jobs/<job_id>/cancel")
def cancel_job(job_id: str) -> Response:
    svc = services()
    cancel(svc, job_id, visible_job(job_id).model)
    job = visible_job(job_id)
    return job_response(job, finished_status=200, running_status=202)


def visible_job(job_id: str) -> Job:
    """The job, if it exists for this caller (another API key's job is a 404 too)."""
    job = services().store.get(job_id)
    if job is None or not owned_by(job.tenant_digest, current_tenant_digest()):
        raise missing(job_id)
    return job


def missing(job_id: str) -> HttpError:
    return not_found(f"job {job_id!r} does not exist or has expired", "job_id")


def job_response(
    job: Job,
    headers: dict[str, str] | None = None,
    finished_status: int = 200,
    running_status: int = 202,
    delivered: bool = False,
    waiting: bool = False,
) -> Response:
    """``delivered``: the request waited for the job, so its ``deliver`` hop is timed too;
    ``waiting``: a read, which says where a queued job stands."""
    described: dict[str, Any] = {**with_urls(job.to_dict(), job.id)}
    # Only a read says where a queued job stands: a submission answers before any estimate.
    queued = queued_fields(services(), job) if waiting else None
    if queued is not None:
        described["queued"] = queued
    response = jsonify(described)
    response.status_code = finished_status if job.status.is_terminal else running_status
    response.headers.update(headers or {})
    return with_server_timing(response, [job], delivered and job.status.is_terminal)
