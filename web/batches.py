"""OpenAI Batch API: submit JSONL of completion/chat requests, poll, fetch JSONL output, cancel.

Every valid line becomes Trickle jobs at batch priority on the same queues: workers always take
interactive jobs first, and batch jobs still share the engine's batching with everyone else.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import redis
from flask import Blueprint, Response, jsonify, request
from werkzeug.formparser import FormDataParser

from trickle.jobs import BATCH_PRIORITY, JobStatus
from web.auth import current_key, current_owner
from web.batch_pending import Reservation
from web.batch_store import BatchItem, BatchRecord, BatchStore, new_batch_id
from web.body import decode_utf8, load_json, read_body
from web.errors import HttpError, invalid, not_found, too_many, unavailable
from web.idempotency import (
    HEADER,
    Created,
    IdempotencyKey,
    earlier,
    matching,
    requested_key,
    ttl_seconds,
)
from web.key_policy import check_key_policy
from web.openai import responses as shapes
from web.openai.requests import OpenAIRequest, parse_chat_request, parse_completion_request
from web.openai.routes import jobs_for_request
from web.services import Services, services
from web.submission import admission_cost, cancel_many, enqueue_many

blueprint = Blueprint("batches", __name__)

BATCH_URLS = ("/v1/chat/completions", "/v1/completions")
JSONL = "application/jsonl"
BACKLOG_RETRY_AFTER_SECONDS = 30


@blueprint.post("/v1/batches")
def create_batch() -> Response:
    svc = services()
    limits = svc.settings.limits
    raw = read_body(limits.max_batch_bytes)
    key = requested_key(raw)
    if key is not None and svc.store.cluster:
        raise invalid(
            HEADER,
            f"{HEADER} on /v1/batches needs a single Redis: on a cluster a batch's records "
            "span slots, so they cannot be written in one step with the key",
        )
    first = earlier(svc, key)
    if first is not None:
        return _replay(svc, first.batch_id)
    lines = _input_lines(raw)
    if not lines:
        raise invalid("input", "the batch input has no requests")
    if len(lines) > limits.max_batch_requests:
        raise invalid("input", f"at most {limits.max_batch_requests} requests per batch")
    items = [_parse_line(number, line) for number, line in lines]
    _check_unique_ids(items)
    parsed = _parse_requests(svc, items)
    reservation = _reserve_jobs(svc, parsed)
    try:
        return _create(svc, key, items, parsed, reservation)
    finally:
        reservation.release()  # a no-op once the fan-out owns it


def _create(
    svc: Services,
    key: IdempotencyKey | None,
    items: list[BatchItem],
    parsed: dict[int, OpenAIRequest],
    reservation: Reservation,
) -> Response:
    """The batch's jobs and record, then their messages in the background: the fan-out takes
    over ``reservation`` and ends it once every message is sent."""
    jobs = []
    shard = key.shard if key else None
    for index, req in parsed.items():
        item = items[index]
        try:
            item_jobs = jobs_for_request(svc, req, priority=BATCH_PRIORITY, shard=shard)
        except HttpError as exc:
            item.refuse(exc.status, exc.to_dict()["error"])
            continue
        item.job_ids = [job.id for job in item_jobs]
        jobs += item_jobs
    check_key_policy(svc, current_key(), jobs)
    svc.rate_limiter.admit(admission_cost(jobs))
    urls = {item.url for item in items}
    batch = BatchRecord(
        new_batch_id(),
        current_owner(),
        time.time(),
        urls.pop() if len(urls) == 1 else "mixed",
        len(items),
    )
    store = _store(svc)
    if key is None:
        store.create(batch, items)
        enqueue_many(svc, jobs, on_sent=reservation.hand_over())
    else:

        def writes(pipe: Any) -> None:
            for job in jobs:
                svc.store.queue_create(pipe, job)
            store.queue_create(pipe, batch, items)

        record = Created(key.fingerprint, [job.id for job in jobs], batch.id).to_json()
        found = svc.store.create_once(key.redis_key, record, ttl_seconds(svc), writes)
        if found is not None:  # a concurrent first request won: its batch
            return _replay(svc, matching(key, found).batch_id)
        enqueue_many(svc, jobs, recorded=True, on_sent=reservation.hand_over())
    return _created_response(svc, batch, items, [job.id for job in jobs])


def _created_response(
    svc: Services, batch: BatchRecord, items: list[BatchItem], job_ids: list[str]
) -> Response:
    try:
        response = jsonify(_batch_object(svc, batch, items))
    except redis.RedisError as exc:  # created: name its jobs, never a 5xx that hides them
        raise unavailable(
            f"job store (Redis) unavailable after creating batch {batch.id}: {exc}", job_ids
        ) from exc
    response.headers["Location"] = f"/v1/batches/{batch.id}"
    return response


def _replay(svc: Services, batch_id: str) -> Response:
    """The batch the first request with this Idempotency-Key created."""
    batch, items = _visible(svc, batch_id)
    job_ids = [job_id for item in items for job_id in item.job_ids or []]
    return _created_response(svc, batch, items, job_ids)


def _parse_requests(svc: Services, items: list[BatchItem]) -> dict[int, OpenAIRequest]:
    """Each line's request by position; a line with a bad body records its error instead."""
    parsed: dict[int, OpenAIRequest] = {}
    for index, item in enumerate(items):
        try:
            req = _parse(svc, item)
            if req.stream:
                raise invalid("body.stream", "batch requests cannot stream")
        except HttpError as exc:
            item.refuse(exc.status, exc.to_dict()["error"])
            continue
        parsed[index] = req
    return parsed


def _parse(svc: Services, item: BatchItem) -> OpenAIRequest:
    """A line's body, validated like the same request sent to ``item.url`` directly."""
    if item.url == "/v1/completions":
        return parse_completion_request(item.body, svc.settings, svc.requests.completion)
    return parse_chat_request(item.body, svc.settings, svc.requests.chat)


def _reserve_jobs(svc: Services, parsed: dict[int, OpenAIRequest]) -> Reservation:
    """Jobs, not lines, are the work: prompt lists and ``n`` multiply a line. A batch is
    bounded in jobs (400), and so is the backlog of batch jobs it joins (429): per model and
    key (the anonymous callers and ``auth.api_keys`` share one), batch-priority jobs only, so
    one key's batches close neither the interactive queue nor another key's batches. The 429
    names the limit, not the depth of work other callers may share."""
    limits = svc.settings.limits
    per_model = Counter[str]()
    for req in parsed.values():
        per_model[req.model] += req.choices
    adding = sum(per_model.values())
    if adding > limits.max_batch_jobs:
        raise invalid(
            "input",
            f"the batch would create {adding} jobs (prompts x n per line); "
            f"the limit is {limits.max_batch_jobs}",
        )
    tenant = svc.tenants.name_of_owner(current_owner())
    waiting = {model: svc.queues.depth(model, tenant, BATCH_PRIORITY) for model in per_model}
    reserved = svc.pending_batch.reserve_within(
        tenant, per_model, waiting, limits.max_batch_backlog
    )
    if isinstance(reserved, str):
        raise too_many(
            "batch_queue_full",
            f"model {reserved!r} has no room for {per_model[reserved]} more batch jobs of this "
            f"key (limits.max_batch_backlog = {limits.max_batch_backlog} per key and model); "
            "retry later",
            BACKLOG_RETRY_AFTER_SECONDS,
        )
    return reserved


@blueprint.get("/v1/batches/<batch_id>")
def get_batch(batch_id: str) -> Response:
    svc = services()
    batch, items = _visible(svc, batch_id)
    return jsonify(_batch_object(svc, batch, items))


@blueprint.post("/v1/batches/<batch_id>/cancel")
def cancel_batch(batch_id: str) -> Response:
    svc = services()
    batch, items = _visible(svc, batch_id)
    now = time.time()
    _store(svc).mark_cancelled(batch_id, now)
    cancel_many(
        svc,
        [
            (job_id, str(item.body.get("model", svc.settings.default_model)))
            for item in items
            for job_id in item.job_ids
        ],
    )
    batch.cancelled_at = batch.cancelled_at or now
    return jsonify(_batch_object(svc, batch, items))


@blueprint.get("/v1/batches/<batch_id>/output")
def batch_output(batch_id: str) -> Response:
    """OpenAI Batch output JSONL for the requests that have finished, in input order."""
    svc = services()
    batch, items = _visible(svc, batch_id)
    statuses = _store(svc).job_statuses(items)
    lines = [
        json.dumps(line, ensure_ascii=False) for line in _output_lines(svc, batch, items, statuses)
    ]
    response = Response("".join(f"{line}\n" for line in lines), content_type=JSONL)
    response.headers["X-Batch-Status"] = _status(batch, items, statuses)
    return response


def _store(svc: Services) -> BatchStore:
    limits = svc.settings.limits
    return BatchStore(svc.redis, limits.queued_ttl_seconds + limits.result_ttl_seconds)


def _visible(svc: Services, batch_id: str) -> tuple[BatchRecord, list[BatchItem]]:
    found = _store(svc).get(batch_id)
    owner = current_owner()
    if found is None or (owner and found[0].owner != owner):
        raise not_found(f"batch {batch_id!r} does not exist or has expired", "batch_id")
    return found


def _input_lines(raw: bytes) -> list[tuple[int, str]]:
    """JSONL from an uploaded file (multipart field ``file``) or the raw body, whatever its
    Content-Type. Lines end at "\n" (and "\r\n") only: U+2028 and friends are text in JSON."""
    if request.mimetype == "multipart/form-data":
        raw = _uploaded_file(raw)
    text = decode_utf8(raw, "input", "the batch input")
    return [(n, line) for n, line in enumerate(text.split("\n"), start=1) if line.strip()]


def _uploaded_file(raw: bytes) -> bytes:
    """The ``file`` field of a multipart body already read (and bounded) by ``read_body``."""
    parser = FormDataParser(max_form_parts=16)
    try:
        _stream, _form, files = parser.parse(
            io.BytesIO(raw), request.mimetype, len(raw), request.mimetype_params
        )
    except ValueError as exc:
        raise invalid("file", f"the multipart body cannot be read: {exc}") from exc
    upload = files.get("file")
    if upload is None:
        raise invalid("file", "a multipart batch needs the JSONL in a field named 'file'")
    data: bytes = upload.read()
    return data


def _parse_line(number: int, line: str) -> BatchItem:
    where = f"line {number}"
    data = load_json(line, where, where)
    if not isinstance(data, dict):
        raise invalid(where, f"{where} must be a JSON object")
    custom_id, method, url, body = (data.get(k) for k in ("custom_id", "method", "url", "body"))
    if not isinstance(custom_id, str) or not custom_id:
        raise invalid(f"{where}.custom_id", f"{where} needs a non-empty string custom_id")
    if method != "POST":
        raise invalid(f"{where}.method", f"{where}: method must be POST")
    if url not in BATCH_URLS:
        raise invalid(f"{where}.url", f"{where}: url must be one of {sorted(BATCH_URLS)}")
    if not isinstance(body, dict):
        raise invalid(f"{where}.body", f"{where}: body must be a JSON object")
    return BatchItem(custom_id=custom_id, url=url, body=body)


def _check_unique_ids(items: list[BatchItem]) -> None:
    repeated = [cid for cid, n in Counter(item.custom_id for item in items).items() if n > 1]
    if repeated:
        raise invalid("custom_id", f"custom_id values must be unique; repeated: {repeated[0]!r}")


def _item_state(item: BatchItem, statuses: dict[str, str]) -> str:
    """pending | completed | failed for one request."""
    if item.error is not None:
        return "failed"
    states = [statuses.get(job_id, "expired") for job_id in item.job_ids]
    if any(s in ("queued", "running") for s in states):
        return "pending"
    return "completed" if all(s == JobStatus.SUCCEEDED.value for s in states) else "failed"


def _status(batch: BatchRecord, items: list[BatchItem], statuses: dict[str, str]) -> str:
    pending = any(_item_state(item, statuses) == "pending" for item in items)
    if batch.cancelled_at is not None:
        return "cancelling" if pending else "cancelled"
    return "in_progress" if pending else "completed"


def _batch_object(svc: Services, batch: BatchRecord, items: list[BatchItem]) -> dict[str, Any]:
    statuses = _store(svc).job_statuses(items)
    states = Counter(_item_state(item, statuses) for item in items)
    status = _status(batch, items, statuses)
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "completion_window": "24h",
        "status": status,
        "created_at": int(batch.created_at),
        "cancelled_at": int(batch.cancelled_at) if batch.cancelled_at else None,
        "request_counts": {
            "total": batch.total,
            "completed": states["completed"],
            "failed": states["failed"],
        },
        "output_url": f"/v1/batches/{batch.id}/output",
    }


def _output_lines(
    svc: Services, batch: BatchRecord, items: list[BatchItem], statuses: dict[str, str]
) -> Iterator[dict[str, Any]]:
    for index, item in enumerate(items):
        state = _item_state(item, statuses)
        if state == "pending":
            continue
        line: dict[str, Any] = {"id": f"{batch.id}_req_{index}", "custom_id": item.custom_id}
        if item.error is not None:
            line["response"] = {"status_code": item.error_status, "body": {"error": item.error}}
            line["error"] = {
                "code": item.error.get("code") or item.error["type"],
                "message": item.error["message"],
            }
            yield line
            continue
        finished = [svc.store.snapshot(job_id, 0) for job_id in item.job_ids]
        jobs = [(job, events) for job, events in finished if job is not None]
        if state == "completed" and len(jobs) == len(item.job_ids):
            req = _parse(svc, item)
            envelope = shapes.Envelope(
                item.job_ids[0], int(batch.created_at), req.model, tuple(item.job_ids)
            )
            body = shapes.result_object(req, envelope, jobs)
            line["response"] = {"status_code": 200, "request_id": item.job_ids[0], "body": body}
            line["error"] = None
        else:
            line["response"] = None
            line["error"] = _failure(jobs, batch)
        yield line


def _failure(jobs: list[Any], batch: BatchRecord) -> dict[str, str]:
    for job, _events in jobs:
        if job.status is JobStatus.FAILED and job.error is not None:
            return {"code": job.error.type, "message": job.error.message}
    if batch.cancelled_at is not None:
        return {"code": "batch_cancelled", "message": "the batch was cancelled first"}
    return {"code": "not_completed", "message": "the request's jobs were canceled or expired"}
