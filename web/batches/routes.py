"""OpenAI Batch API: a batch from an uploaded file (``input_file_id``, as OpenAI's client sends
it, ``web.batches.input_file``) or from JSONL in the body (``web.batches.body_input``, stored
as its input file); poll, list, cancel, read the output.

Every valid line becomes Trickle jobs at batch priority on the same queues: workers always take
interactive jobs first, and batch jobs still share the engine's batching with everyone else.
The batch consumer's tasks (``web.batches.tasks``) read every batch's input into jobs, keep its
counts and write its output and error files (``web.batches.finalize``): the routes here only
record, read and cancel, and a read never writes (a poll reads the batch's record alone).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

from flask import Blueprint, Response, jsonify, request, stream_with_context

from trickle import keys
from trickle.queue import BROKER_ERRORS, enqueue_batch_task
from web.admission.auth import current_tenant_digest
from web.admission.ratelimit import counted_read
from web.batches.body_input import create_body_batch
from web.batches.files import cursor_page, page_limit
from web.batches.finalize import batch_store, cancel_pending
from web.batches.input_file import create_file_batch, file_batch_request
from web.batches.objects import batch_object, next_start
from web.batches.output import finished_slices, output_line
from web.batches.store import BatchRecord, BatchStore
from web.common.body import read_body
from web.common.errors import invalid, not_found
from web.common.openapi_parts import JSONL
from web.common.response_models import Batch
from web.services import services
from web.streams.follow import owned_by

log = logging.getLogger(__name__)
blueprint = Blueprint("batches", __name__)

DEFAULT_PAGE = 20
MAX_PAGE = 100


@blueprint.post("/v1/batches")
def create_batch() -> Response:
    """Records the batch ``validating`` and answers at once; the batch consumer reads it."""
    svc = services()
    store = batch_store(svc)
    raw = read_body(svc.settings.limits.max_batch_bytes)
    file_request = file_batch_request(raw)
    if file_request is not None:
        batch = create_file_batch(svc, store, file_request)
    else:
        batch = create_body_batch(svc, store, raw)
    response = jsonify(batch_object(svc, batch))
    response.headers["Location"] = f"/v1/batches/{batch.id}"
    return response


@blueprint.get("/v1/batches")
@counted_read
def list_batches() -> Response:
    svc = services()
    store = batch_store(svc)
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
        objects.append(batch_object(svc, found))
    return jsonify(cursor_page(objects, limit))


@blueprint.get("/v1/batches/<batch_id>")
def get_batch(batch_id: str) -> Response:
    svc = services()
    store = batch_store(svc)
    found = batch_object(svc, _visible_record(store, batch_id))
    queued = next_start(svc, store, found)
    if queued is not None:
        found["queued"] = queued
    return jsonify(found)


@blueprint.post("/v1/batches/<batch_id>/cancel")
def cancel_batch(batch_id: str) -> Response:
    svc = services()
    store = batch_store(svc)
    batch = _visible_record(store, batch_id)
    if batch.stage in ("validating", "in_progress") and batch.cancelling_at is None:
        batch.cancelling_at = time.time()
        store.mark_cancelled(batch_id, batch.cancelling_at)
        cancel_pending(svc, store, batch)
        try:  # its files now rather than at the next sweep
            enqueue_batch_task(svc.celery, keys.BATCH_SETTLE_TASK, batch_id)
        except BROKER_ERRORS as exc:
            log.warning("batch %s: settled at the next sweep: %s", batch_id, exc)
    return jsonify(batch_object(svc, batch))


@blueprint.get("/v1/batches/<batch_id>/output")
@counted_read
def batch_output(batch_id: str) -> Response:
    """OpenAI Batch output JSONL for the requests that have finished, in input order."""
    svc = services()
    store = batch_store(svc)
    found = _visible_record(store, batch_id)
    status = batch_object(svc, found)["status"]

    def lines() -> Iterator[str]:
        for index, item, state, jobs in finished_slices(svc, store, found):
            if state != "pending":
                line = output_line(svc, found, index, item, state, jobs)
                yield json.dumps(line, ensure_ascii=False) + "\n"

    response = Response(stream_with_context(lines()), content_type=JSONL)
    response.headers["X-Batch-Status"] = status
    return response


def _visible_record(store: BatchStore, batch_id: str) -> BatchRecord:
    found = store.record(batch_id)
    if found is None or not owned_by(found.tenant_digest, current_tenant_digest()):
        raise not_found(f"batch {batch_id!r} does not exist or has expired", "batch_id")
    return found
