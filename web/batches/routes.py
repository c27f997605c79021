"""OpenAI Batch API: a batch from an uploaded file (``input_file_id``, as OpenAI's client sends
it, ``web.batches.input_file``) or from JSONL in the body; poll, list, cancel, read the output.

Every valid line becomes Trickle jobs at batch priority on the same queues: workers always take
interactive jobs first, and batch jobs still share the engine's batching with everyone else.
A batch ends with an output file and an error file (``web.batches.finalize``), written by the
batch consumer's tasks (``web.batches.tasks``), which also read a file batch's input: the
routes here only record, read and cancel, and a read never writes.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator

import redis
from flask import Blueprint, Response, jsonify, request, stream_with_context
from werkzeug.formparser import FormDataParser

from trickle import keys
from trickle.jobs import BATCH_PRIORITY, Job
from trickle.queue import BROKER_ERRORS, enqueue_batch_task
from web.admission.auth import current_key, current_tenant_digest
from web.admission.idempotency import (
    IDEMPOTENCY_HEADER,
    Created,
    IdempotencyKey,
    earlier,
    matching,
    requested_key,
    ttl_seconds,
)
from web.admission.key_policy import check_key_policy
from web.admission.ratelimit import counted_read
from web.admission.submission import admission_cost, enqueue_many
from web.batches.files import cursor_page, page_limit
from web.batches.finalize import batch_result_ttl, batch_store, cancel_pending
from web.batches.input_file import create_file_batch, file_batch_request
from web.batches.lines import check_line_sizes, parse_line, parse_request
from web.batches.objects import current_object, next_start
from web.batches.output import finished_slices, output_line
from web.batches.pending import Reservation
from web.batches.quota import hold_batch_storage
from web.batches.store import BatchItem, BatchRecord, BatchStore, new_batch_id
from web.common.body import decode_utf8, read_body
from web.common.errors import HttpError, invalid, not_found, too_many, unavailable
from web.common.openapi_parts import JSONL
from web.common.response_models import Batch
from web.common.turns import collection_paused, in_groups, in_turns
from web.openai.requests import OpenAIRequest
from web.openai.routes import jobs_for_request
from web.services import Services, services
from web.streams.follow import owned_by

log = logging.getLogger(__name__)
blueprint = Blueprint("batches", __name__)

BATCH_URLS = ("/v1/chat/completions", "/v1/completions")
BACKLOG_RETRY_AFTER_SECONDS = 30
DEFAULT_PAGE = 20
MAX_PAGE = 100
# Jobs per transaction when a JSONL batch records them (about 1,500 commands).
RECORD_GROUP = 500


@blueprint.post("/v1/batches")
def create_batch() -> Response:
    with collection_paused():  # a batch's records would trip full collections (web.common.turns)
        return _create_batch()


def _create_batch() -> Response:
    svc = services()
    limits = svc.settings.limits
    raw = read_body(limits.max_batch_bytes)
    file_request = file_batch_request(raw)
    if file_request is not None:
        created = create_file_batch(svc, _store(svc), file_request)
        return _created_response(svc, created, [])
    key = requested_key(raw)
    if key is not None and svc.store.cluster:
        raise invalid(
            IDEMPOTENCY_HEADER,
            f"{IDEMPOTENCY_HEADER} on /v1/batches needs a single Redis: on a cluster a batch's "
            "records span slots, so they cannot be written in one step with the key",
        )
    first = earlier(svc, key)
    if first is not None:
        return _replay(svc, first.batch_id)
    batch_id = new_batch_id()
    held = hold_batch_storage(svc, _store(svc), batch_id, len(raw), "input")
    made = False
    try:
        response, made = _create_from_lines(svc, key, raw, batch_id)
    finally:
        if not made:  # refused, or a concurrent first request with the key made its batch
            held.release(batch_id)
    return response


def _create_from_lines(
    svc: Services, key: IdempotencyKey | None, raw: bytes, batch_id: str
) -> tuple[Response, bool]:
    """The JSONL body's batch, its input already held; False with the batch another request
    with the same key made."""
    limits = svc.settings.limits
    lines = _input_lines(raw)
    if not lines:
        raise invalid("input", "the batch input has no requests")
    if len(lines) > limits.max_batch_requests:
        raise invalid("input", f"at most {limits.max_batch_requests} requests per batch")
    check_line_sizes(lines, svc.settings.web.max_body_bytes)
    items = [parse_line(number, line, BATCH_URLS) for number, line in in_turns(lines)]
    _check_unique_ids(items)
    parsed = _parse_requests(svc, items)
    reservation = _reserve_jobs(svc, parsed)
    try:
        return _create(svc, key, items, parsed, reservation, batch_id, len(raw))
    finally:
        reservation.release()  # a no-op once the fan-out owns it


def _create(
    svc: Services,
    key: IdempotencyKey | None,
    items: list[BatchItem],
    parsed: dict[int, OpenAIRequest],
    reservation: Reservation,
    batch_id: str,
    input_bytes: int,
) -> tuple[Response, bool]:
    """The batch's jobs and record, then their messages in the background: the fan-out takes
    over ``reservation`` and ends it once every message is sent. ``input_bytes``: the body's,
    which the batch holds against the key's storage (web.batch_quota). False with the batch
    a concurrent first request with the same key made instead."""
    jobs = []
    for index, req in in_turns(parsed.items()):
        item = items[index]
        try:
            # Ids from any shard, never drawn into the key's (256 draws an id): the key's script
            # writes the batch alone, and a batch with a key needs a single Redis anyway.
            item_jobs = jobs_for_request(svc, req, priority=BATCH_PRIORITY)
        except HttpError as exc:
            item.refuse(exc.status, exc.to_dict()["error"])
            continue
        for job in item_jobs:
            job.result_ttl_seconds = batch_result_ttl(svc)
        item.job_ids = [job.id for job in item_jobs]
        jobs += item_jobs
    check_key_policy(svc, current_key(), jobs)
    svc.rate_limiter.admit(admission_cost(jobs))
    urls = {item.url for item in items}
    now = time.time()
    endpoint = urls.pop() if len(urls) == 1 else "mixed"
    batch = BatchRecord(batch_id, current_tenant_digest(), now, endpoint, len(items))
    batch.in_progress_at = now
    batch.input_bytes = input_bytes
    store = _store(svc)
    found = _record(svc, store, key, batch, items, jobs)
    if found is not None:  # a concurrent first request with the key won: its batch
        return _replay(svc, found.batch_id), False
    enqueue_many(svc, jobs, recorded=True, on_sent=reservation.hand_over())
    return _created_response(svc, batch, [job.id for job in jobs]), True


def _record(
    svc: Services,
    store: BatchStore,
    key: IdempotencyKey | None,
    batch: BatchRecord,
    items: list[BatchItem],
    jobs: list[Job],
) -> Created | None:
    """The jobs first, a group per transaction (packing thousands of commands at once would
    hold the event loop), then the batch that names them (with the key, in its script): a
    concurrent poll never sees a batch whose jobs do not exist yet, which would read as expired
    lines. Returns what the key's first request created when it was not this one; then, as on
    a Redis error, the jobs recorded here are taken back (a process that dies in between
    leaves them to the workers' sweep, which runs them for no batch)."""
    recorded: list[Job] = []
    try:
        for group in in_groups(jobs, RECORD_GROUP):
            svc.store.create_many(group)
            recorded += group
        if key is None:
            store.create(batch, items)
            return None
        record = Created(key.fingerprint, [job.id for job in jobs], batch.id).to_json()
        ttl = ttl_seconds(svc)
        found = svc.store.create_once(
            key.redis_key, record, ttl, lambda pipe: store.queue_create(pipe, batch, items)
        )
    except redis.RedisError:
        _take_back(svc, recorded)
        raise
    if found is not None:
        _take_back(svc, recorded)
        return matching(key, found)
    store.index(batch)
    return None


def _take_back(svc: Services, jobs: list[Job]) -> None:
    """Delete records of jobs never published, a group per transaction (best effort)."""
    try:
        for group in in_groups(jobs, RECORD_GROUP):
            svc.store.delete_unpublished([job.id for job in group])
    except redis.RedisError:
        log.exception("could not take back %d unpublished batch job(s)", len(jobs))


def _created_response(svc: Services, batch: BatchRecord, job_ids: list[str]) -> Response:
    try:
        response = jsonify(current_object(svc, _store(svc), batch))
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
    return _created_response(svc, batch, job_ids)


def _parse_requests(svc: Services, items: list[BatchItem]) -> dict[int, OpenAIRequest]:
    """Each line's request by position; a line with a bad body records its error instead."""
    parsed: dict[int, OpenAIRequest] = {}
    for index, item in in_turns(enumerate(items)):
        try:
            req = parse_request(svc, item)
        except HttpError as exc:
            item.refuse(exc.status, exc.to_dict()["error"])
            continue
        assert isinstance(req, OpenAIRequest)  # the JSONL route takes no /v1/responses line
        parsed[index] = req
    return parsed


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
    tenant = svc.tenants.name_of_digest(current_tenant_digest())
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


@blueprint.get("/v1/batches")
@counted_read
def list_batches() -> Response:
    svc = services()
    store = _store(svc)
    limit = page_limit(DEFAULT_PAGE, MAX_PAGE)
    tenant_digest = current_tenant_digest()
    ids = store.of_tenant(tenant_digest)
    after = request.args.get("after")
    if after is not None:
        if after not in ids:
            raise invalid("after", f"{after!r} is not in this list")
        ids = ids[ids.index(after) + 1 :]
    objects: list[Batch] = []
    for batch_id in ids:
        if len(objects) > limit:  # one more than the page tells has_more
            break
        found = store.record(batch_id)
        if found is None:  # expired (its entry leaves the index at the tenant's next batch)
            continue
        objects.append(current_object(svc, store, found))
    return jsonify(cursor_page(objects, limit))


@blueprint.get("/v1/batches/<batch_id>")
def get_batch(batch_id: str) -> Response:
    svc = services()
    store = _store(svc)
    found = current_object(svc, store, _visible_record(svc, store, batch_id))
    queued = next_start(svc, store, found)
    if queued is not None:
        found["queued"] = queued
    return jsonify(found)


@blueprint.post("/v1/batches/<batch_id>/cancel")
def cancel_batch(batch_id: str) -> Response:
    svc = services()
    store = _store(svc)
    batch = _visible_record(svc, store, batch_id)
    if batch.stage in ("validating", "in_progress") and batch.cancelling_at is None:
        batch.cancelling_at = time.time()
        store.mark_cancelled(batch_id, batch.cancelling_at)
        cancel_pending(svc, store, batch)
        try:  # its files now rather than at the next sweep
            enqueue_batch_task(svc.celery, keys.BATCH_SETTLE_TASK, batch_id)
        except BROKER_ERRORS as exc:
            log.warning("batch %s: settled at the next sweep: %s", batch_id, exc)
    return jsonify(current_object(svc, store, batch))


@blueprint.get("/v1/batches/<batch_id>/output")
@counted_read
def batch_output(batch_id: str) -> Response:
    """OpenAI Batch output JSONL for the requests that have finished, in input order."""
    svc = services()
    store = _store(svc)
    found = _visible_record(svc, store, batch_id)
    status = current_object(svc, store, found)["status"]

    def lines() -> Iterator[str]:
        for index, item, state, jobs in finished_slices(svc, store, found):
            if state != "pending":
                line = output_line(svc, found, index, item, state, jobs)
                yield json.dumps(line, ensure_ascii=False) + "\n"

    response = Response(stream_with_context(lines()), content_type=JSONL)
    response.headers["X-Batch-Status"] = status
    return response


def _store(svc: Services) -> BatchStore:
    return batch_store(svc)


def _visible_record(svc: Services, store: BatchStore, batch_id: str) -> BatchRecord:
    found = store.record(batch_id)
    if found is None or not owned_by(found.tenant_digest, current_tenant_digest()):
        raise not_found(f"batch {batch_id!r} does not exist or has expired", "batch_id")
    return found


def _visible(svc: Services, batch_id: str) -> tuple[BatchRecord, list[BatchItem]]:
    found = _store(svc).get(batch_id)
    tenant_digest = current_tenant_digest()
    if found is None or (tenant_digest and found[0].tenant_digest != tenant_digest):
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


def _check_unique_ids(items: list[BatchItem]) -> None:
    repeated = [cid for cid, n in Counter(item.custom_id for item in items).items() if n > 1]
    if repeated:
        raise invalid("custom_id", f"custom_id values must be unique; repeated: {repeated[0]!r}")
