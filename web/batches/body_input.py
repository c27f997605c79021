"""``POST /v1/batches`` with the JSONL in the body (Trickle's extension; or as a multipart
field ``file``): stored as the batch's input file, then read as any file batch's is.

The request checks only what must hold before it answers: the body's size (``read_body``),
that it is UTF-8 text of at most ``limits.max_batch_requests`` lines, none past
``web.max_body_bytes``, whose first line is a batch line's envelope (what tells JSONL input
from anything else), the ``Idempotency-Key`` and the key's batch storage. It then writes the
body to the file store (``purpose: "batch"``, named after the batch), records the batch
``validating`` and answers at once: the batch consumer's ingest task turns its lines into jobs
(``web.batches.ingest``), so every other line, and every line's body, is judged there and a
bad one fails on its own, in the error file. A web process killed after the answer loses
nothing: the input is in Redis and the sweep resends its reading.
"""

from __future__ import annotations

import io
import sys

from flask import request
from werkzeug.formparser import FormDataParser

from trickle.store.held_quota import QuotaFull
from web.admission.auth import current_tenant_digest
from web.admission.idempotency import IDEMPOTENCY_HEADER, earlier, requested_key
from web.batches.file_store import FileRecord
from web.batches.input_file import Input, earlier_batch, record_batch, start_reading
from web.batches.lines import check_line_size, parse_line
from web.batches.quota import hold_batch_storage, storage_full
from web.batches.store import BatchRecord, BatchStore, new_batch_id
from web.batches.unread import count_input
from web.common.body import decode_utf8
from web.common.errors import HttpError, invalid
from web.services import Services

# The urls a JSONL body's lines may name, mixed.
BODY_URLS = ("/v1/chat/completions", "/v1/completions")
INPUT_PURPOSE = "batch"


def create_body_batch(svc: Services, store: BatchStore, raw: bytes) -> BatchRecord:
    """The batch of the JSONL ``raw`` (the body read already, within
    ``limits.max_batch_bytes``): recorded ``validating``, its reading sent; with an
    ``Idempotency-Key`` used before, the batch its first request made."""
    key = requested_key(raw)
    if key is not None and svc.store.cluster:
        raise invalid(
            IDEMPOTENCY_HEADER,
            f"{IDEMPOTENCY_HEADER} on /v1/batches needs a single Redis: on a cluster a batch's "
            "records span slots, so they cannot be written in one step with the key",
        )
    first = earlier(svc, key)
    if first is not None:
        return earlier_batch(store, first.batch_id)
    data = _uploaded_file(raw) if request.mimetype == "multipart/form-data" else raw
    first_url = _checked_lines(svc, data)
    batch_id = new_batch_id()
    held = hold_batch_storage(svc, store, batch_id, len(raw), "input")
    source: FileRecord | None = None
    try:
        source = _store_input(svc, batch_id, data)
        count = count_input(svc, batch_id, data.split(b"\n"))
        given = Input(batch_id, source, first_url, count, "input", BODY_URLS)
        batch = record_batch(svc, store, key, given, None)
    except BaseException:
        held.release(batch_id)
        if source is not None:
            svc.files.delete(source)
        raise
    if batch.id != batch_id:  # a concurrent first request with the key made its batch
        held.release(batch_id)
        svc.files.delete(source)
    start_reading(svc, batch)
    return batch


def _checked_lines(svc: Services, data: bytes) -> str:
    """The body's first line's url, its lines checked (split at "\\n" only: U+2028 and
    friends are text in JSON); a 4xx naming ``input`` or the line for a body that cannot be a
    batch. Lines are numbered as the batch consumer numbers them (non-blank ones)."""
    limits = svc.settings.limits
    decode_utf8(data, "input", "the batch input")
    max_line = svc.settings.web.max_body_bytes
    first = b""
    count = 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        count += 1
        check_line_size(count, len(line), max_line)
        if count == 1:
            first = line
    if count == 0:
        raise invalid("input", "the batch input has no requests")
    if count > limits.max_batch_requests:
        raise invalid("input", f"at most {limits.max_batch_requests} requests per batch")
    return parse_line(1, first.decode(), BODY_URLS).url


def _store_input(svc: Services, batch_id: str, data: bytes) -> FileRecord:
    """The body as a file of the batch's key, taking its room in the key's file storage as
    an upload does (a body with no room is a 429 naming ``input``), which the batch names as
    its ``input_file_id``."""
    tenant_digest = current_tenant_digest()
    name = f"{batch_id}_input.jsonl"
    try:
        writer = svc.files.writer(tenant_digest, name, sys.maxsize)
    except QuotaFull as exc:
        raise _no_room(svc, exc, len(data)) from exc
    try:
        writer.write(data)
        writer.finish()
        record = svc.files.record_for(writer, tenant_digest, name, INPUT_PURPOSE)
        svc.files.commit(record)
    except QuotaFull as exc:
        writer.discard()
        raise _no_room(svc, exc, len(data)) from exc
    except BaseException:
        writer.discard()
        raise
    return record


def _no_room(svc: Services, full: QuotaFull, size: int) -> HttpError:
    if full.kind == "count":
        return HttpError(
            429,
            "file_storage_full",
            f"this key has {full.used} live files and files.max_files_per_key is "
            f"{svc.settings.files.max_files_per_key}: the batch's input is stored as one; "
            "delete files or wait for them to expire",
            "input",
            code="file_storage_full",
        )
    return storage_full(svc, full.used, f"the batch's input ({size} bytes) has no room", "input")


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
