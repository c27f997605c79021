"""Submit, read and cancel jobs (``/v1/jobs``)."""

from __future__ import annotations

import json
import time
from typing import Any

from flask import Blueprint, Response, jsonify, request

from web.errors import invalid, not_found, unavailable
from web.hub import Signal
from web.services import Services, services
from web.validation import check_prompt_length, parse_job_request, parse_wait
from worker.jobs import Job, Usage, new_job_id
from worker.queueing import enqueue_generation

blueprint = Blueprint("jobs", __name__)


@blueprint.post("/v1/jobs")
def submit_job() -> Response:
    svc = services()
    wait = parse_wait(request.headers.get("Prefer"), svc.settings.web.max_wait_seconds)
    job_request = parse_job_request(read_json_body(), svc.settings)
    prompt_tokens = count_prompt_tokens(svc, job_request.model, job_request.prompt)
    check_prompt_length(prompt_tokens, job_request.params, svc.settings, job_request.model)
    job = Job(
        id=new_job_id(),
        model=job_request.model,
        prompt=job_request.prompt,
        params=job_request.params,
        usage=Usage(prompt_tokens=prompt_tokens),
        created_at=time.time(),
    )
    # Subscribe before enqueueing so a fast job's completion cannot slip past a waiting client.
    with svc.hub.subscribe(job.id) as subscription:
        svc.store.create(job)
        enqueue_generation(svc.celery, job.id, job.model)
        if wait > 0:
            wait_until_finished(svc, job.id, subscription, wait)
        current = svc.store.get(job.id) or job
    return job_response(current, headers={"Location": f"/v1/jobs/{job.id}"})


@blueprint.get("/v1/jobs/<job_id>")
def get_job(job_id: str) -> Response:
    svc = services()
    wait = parse_wait(request.headers.get("Prefer"), svc.settings.web.max_wait_seconds)
    if wait > 0:
        with svc.hub.subscribe(job_id) as subscription:
            wait_until_finished(svc, job_id, subscription, wait)
    job = svc.store.get(job_id)
    if job is None:
        raise not_found(f"job {job_id!r} does not exist or has expired", "job_id")
    return job_response(job, finished_status=200, running_status=200)


@blueprint.post("/v1/jobs/<job_id>/cancel")
def cancel_job(job_id: str) -> Response:
    svc = services()
    outcome = svc.store.cancel(job_id, time.time())
    if outcome.value == "missing":
        raise not_found(f"job {job_id!r} does not exist or has expired", "job_id")
    job = svc.store.get(job_id)
    if job is None:
        raise not_found(f"job {job_id!r} does not exist or has expired", "job_id")
    return job_response(job, finished_status=200, running_status=202)


def job_response(
    job: Job,
    headers: dict[str, str] | None = None,
    finished_status: int = 200,
    running_status: int = 202,
) -> Response:
    response = jsonify(job.to_dict())
    response.status_code = finished_status if job.status.is_terminal else running_status
    response.headers.update(headers or {})
    return response


def wait_until_finished(svc: Services, job_id: str, subscription: Any, seconds: float) -> None:
    """Block until the job ends or ``seconds`` pass; token traffic is ignored."""
    deadline = time.monotonic() + seconds
    while True:
        job = svc.store.get(job_id)
        if job is None or job.status.is_terminal:
            return
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            delivery = subscription.get(min(remaining, 1.0))
            if delivery is None or delivery.signal in (Signal.DONE, Signal.RESYNC):
                break


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
