"""OpenAI's Files API: upload (multipart ``file`` + ``purpose``), list, read, download, delete.

An upload is parsed as it arrives and each 256 KiB of the file goes to Redis at once
(``web.batches.file_store``), so a web process holds one chunk of it, never the file. A file belongs
to the API key that uploaded it: another key's file is a 404, as an unknown one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flask import Blueprint, Response, jsonify, request, stream_with_context
from werkzeug.exceptions import HTTPException
from werkzeug.formparser import FormDataParser

from trickle import keys
from trickle.config.sections import FileSettings
from trickle.store.held_quota import QuotaFull
from web.admission.auth import current_tenant_digest
from web.admission.ratelimit import counted_read
from web.batches.file_store import (
    MAX_FILENAME_CHARS,
    UPLOAD_PURPOSES,
    FileRecord,
    FileStore,
    FileTooLarge,
    FileWriter,
)
from web.batches.finalize import batch_store
from web.common.errors import HttpError, invalid, not_found
from web.services import Services, services
from web.streams.follow import owned_by

blueprint = Blueprint("files", __name__)

# A multipart body's own bytes besides the file: boundaries, part headers, ``purpose``.
FORM_OVERHEAD_BYTES = 65_536
# werkzeug's decoder holds up to this much of a part it has not framed yet (a file's bytes
# after its last line break included), besides a text field's value: above its 64 KiB reads.
FORM_MEMORY_BYTES = 500_000
MAX_FORM_PARTS = 8
MAX_LIST_LIMIT = 10_000


@blueprint.post("/v1/files")
def upload_file() -> Response:
    svc = services()
    settings = svc.settings.files
    store = svc.files
    tenant_digest = current_tenant_digest()
    if request.mimetype != "multipart/form-data":
        raise invalid("file", "upload the file as multipart/form-data, in a field named 'file'")
    length = request.content_length
    if length is not None and length > settings.max_file_bytes + FORM_OVERHEAD_BYTES:
        raise _too_large(settings.max_file_bytes, "the file")
    writers: list[FileWriter] = []

    def stream_factory(**part: Any) -> FileWriter:
        filename = part.get("filename") or "file"
        if len(filename) > MAX_FILENAME_CHARS:
            raise invalid("file", f"a filename is at most {MAX_FILENAME_CHARS} characters")
        writers.append(store.writer(tenant_digest, filename, settings.max_file_bytes))
        return writers[-1]

    try:
        form, files = _parse(stream_factory, settings.max_file_bytes)
        purpose = form.get("purpose")
        if purpose not in UPLOAD_PURPOSES:
            raise invalid("purpose", f"purpose must be one of {list(UPLOAD_PURPOSES)}")
        upload = files.get("file")
        if upload is not None:
            writer, filename = upload.stream, upload.filename or "file"
        elif "file" in form:  # a part without a filename arrives as a field (curl -F file=<x)
            writer, filename = stream_factory(), "file"
            writer.write(form["file"].encode())
        else:
            raise invalid("file", "a multipart upload needs the file in a field named 'file'")
        assert isinstance(writer, FileWriter)
        writer.finish()
        record = store.record_for(writer, tenant_digest, filename, purpose)
        store.commit(record)
    except FileTooLarge as exc:
        _discard(writers)
        raise _too_large(settings.max_file_bytes, "the file") from exc
    except QuotaFull as exc:
        _discard(writers)
        raise _storage_full(settings, exc) from exc
    except BaseException:
        _discard(writers)
        raise
    _discard([other for other in writers if other is not writer])
    return jsonify(record.to_object())


def _storage_full(settings: FileSettings, full: QuotaFull) -> HttpError:
    """The key's files fill its storage (413 naming ``file`` and the limit), or its file
    count (429): the key's own figures only."""
    if full.kind == "count":
        return HttpError(
            429,
            "file_storage_full",
            f"this key has {full.used} live files (a running batch's output counts as one); "
            f"files.max_files_per_key is {settings.max_files_per_key}: delete files or wait "
            "for them to expire",
            "file",
            code="file_storage_full",
        )
    return HttpError(
        413,
        "request_too_large",
        f"the key's remaining file storage is too small: its files hold {full.used} bytes and "
        f"files.max_bytes_per_key is {settings.max_bytes_per_key} (names and records count "
        "too); delete files or wait for them to expire",
        "file",
        code="file_storage_full",
    )


def _parse(stream_factory: Any, max_file_bytes: int) -> tuple[Any, Any]:
    """The multipart body's fields and files, each file part written by ``stream_factory``."""
    request.max_content_length = max_file_bytes + FORM_OVERHEAD_BYTES
    parser = FormDataParser(
        stream_factory,
        max_form_memory_size=FORM_MEMORY_BYTES,
        max_form_parts=MAX_FORM_PARTS,
        silent=False,
    )
    try:
        _stream, form, files = parser.parse(
            request.stream, request.mimetype, request.content_length, request.mimetype_params
        )
    except HTTPException as exc:
        if exc.code == 413:  # werkzeug's bounds on the form; a file too large is FileTooLarge
            raise invalid(
                "body",
                f"a multipart upload takes at most {MAX_FORM_PARTS} parts, each field at most "
                f"{FORM_MEMORY_BYTES} bytes",
            ) from exc
        raise
    except ValueError as exc:
        raise invalid("file", f"the multipart body cannot be read: {exc}") from exc
    return form, files


def _too_large(limit: int, what: str) -> HttpError:
    return HttpError(413, "request_too_large", f"{what} is limited to {limit} bytes", "file")


def _discard(writers: list[FileWriter]) -> None:
    for writer in writers:
        writer.discard()


@blueprint.get("/v1/files")
@counted_read
def list_files() -> Response:
    """A page of the caller's files, read a slice at a time (never all of the key's)."""
    svc = services()
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", "order must be 'asc' or 'desc'")
    limit = page_limit(MAX_LIST_LIMIT, MAX_LIST_LIMIT)
    after = request.args.get("after")
    found = svc.files.page(
        current_tenant_digest(), limit, after, order == "desc", request.args.get("purpose")
    )
    if found is None:
        raise invalid("after", f"{after!r} is not in this list")
    return jsonify(cursor_page([record.to_object() for record in found], limit))


def page_limit(default: int, most: int) -> int:
    """The ``limit`` query parameter of a list, 1 to ``most``."""
    raw = request.args.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise invalid("limit", f"limit must be an integer from 1 to {most}")
    return int(raw)


def cursor_page(objects: Sequence[Mapping[str, Any]], limit: int) -> dict[str, Any]:
    """A page of the first ``limit`` objects; more than that means ``has_more``."""
    data = list(objects[:limit])
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(objects) > limit,
    }


@blueprint.get("/v1/files/<file_id>")
def get_file(file_id: str) -> Response:
    return jsonify(visible_file(services().files, file_id).to_object())


@blueprint.get("/v1/files/<file_id>/content")
@counted_read
def file_content(file_id: str) -> Response:
    store = services().files
    record = visible_file(store, file_id)
    chunks = stream_with_context(store.chunks(record.id))
    response = Response(chunks, content_type="application/octet-stream")
    response.headers["Content-Length"] = str(record.bytes)
    response.headers["Content-Disposition"] = f'attachment; filename="{_quoted(record)}"'
    return response


@blueprint.delete("/v1/files/<file_id>")
def delete_file(file_id: str) -> Response:
    svc = services()
    store = svc.files
    record = visible_file(store, file_id)
    _check_unread(svc, record)
    store.delete(record)
    return jsonify({"id": record.id, "object": "file", "deleted": True})


def _check_unread(svc: Services, record: FileRecord) -> None:
    """409 while a batch still reads the file as its input: deleting it would cut the batch
    short (a batch that meets its input gone anyway fails ``input_file_unavailable``)."""
    readers = sorted(svc.redis.smembers(keys.file_readers(record.id)))
    for batch_id in readers:
        reading = batch_store(svc).record(str(batch_id))
        if reading is not None and reading.stage == "validating":
            raise HttpError(
                409,
                "invalid_request_error",
                f"file {record.id!r} is the input of batch {batch_id!r}, whose input is still "
                "being read; retry once the batch is in_progress, or cancel it",
                "file_id",
                code="file_in_use",
            )


def visible_file(store: FileStore, file_id: str, param: str = "file_id") -> FileRecord:
    """The caller's file; unknown, expired, deleted or another key's: 404 naming ``param``."""
    record = store.get(file_id)
    if record is None or not owned_by(record.tenant_digest, current_tenant_digest()):
        raise not_found(f"file {file_id!r} does not exist", param)
    return record


def _quoted(record: FileRecord) -> str:
    """The filename as a header can carry it (printable ASCII, no quote or backslash)."""
    return "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in record.filename)
