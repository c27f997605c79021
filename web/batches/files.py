"""OpenAI's Files API: upload (multipart ``file`` + ``purpose``), list, read, download, delete.

An upload is parsed as it arrives and each 256 KiB of the file goes to Redis at once
(``web.batches.file_store``), so a web process holds one chunk of it, never the file. A file belongs
to the API key that uploaded it: another key's file is a 404, as an unknown one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from flask import Blueprint, Response, jsonify, request, stream_with_context
from werkzeug.exceptions import HTTPException
from werkzeug.formparser import FormDataParser

from web.admission.auth import current_owner
from web.batches.file_store import UPLOAD_PURPOSES, FileRecord, FileStore, FileTooLarge, FileWriter
from web.common.errors import HttpError, invalid, not_found
from web.services import services
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
    owner = current_owner()
    if request.mimetype != "multipart/form-data":
        raise invalid("file", "upload the file as multipart/form-data, in a field named 'file'")
    room = settings.max_bytes_per_key - store.used_bytes(owner)
    limit = min(settings.max_file_bytes, max(room, 0))
    length = request.content_length
    if length is not None and length > settings.max_file_bytes + FORM_OVERHEAD_BYTES:
        raise _too_large(settings.max_file_bytes, "the file")
    writers: list[FileWriter] = []

    def stream_factory(**_part: Any) -> FileWriter:
        writers.append(store.writer(limit))
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
        record = store.record_for(writer, owner, filename, purpose)
        store.commit(record)
    except FileTooLarge as exc:
        _discard(writers)
        if limit < settings.max_file_bytes:
            raise _too_large(limit, "the key's remaining file storage") from exc
        raise _too_large(settings.max_file_bytes, "the file") from exc
    except BaseException:
        _discard(writers)
        raise
    _discard([other for other in writers if other is not writer])
    return jsonify(record.to_object())


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
def list_files() -> Response:
    svc = services()
    purpose = request.args.get("purpose")
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", "order must be 'asc' or 'desc'")
    limit = page_limit(MAX_LIST_LIMIT, MAX_LIST_LIMIT)
    found = svc.files.owned(current_owner())
    if order == "desc":
        found.reverse()
    if purpose is not None:
        found = [record for record in found if record.purpose == purpose]
    return jsonify(page([record.to_object() for record in found], limit))


def page_limit(default: int, most: int) -> int:
    """The ``limit`` query parameter of a list, 1 to ``most``."""
    raw = request.args.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise invalid("limit", f"limit must be an integer from 1 to {most}")
    return int(raw)


def page(objects: Sequence[Mapping[str, Any]], limit: int) -> dict[str, Any]:
    """OpenAI's cursor page of ``objects`` (in list order): those after the ``after`` id."""
    after = request.args.get("after")
    if after is not None:
        ids = [item["id"] for item in objects]
        if after not in ids:
            raise invalid("after", f"{after!r} is not in this list")
        objects = objects[ids.index(after) + 1 :]
    return cursor_page(objects[: limit + 1], limit)


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
def file_content(file_id: str) -> Response:
    store = services().files
    record = visible_file(store, file_id)

    def body() -> Iterator[bytes]:
        yield from store.chunks(record.id)

    response = Response(stream_with_context(body()), content_type="application/octet-stream")
    response.headers["Content-Length"] = str(record.bytes)
    response.headers["Content-Disposition"] = f'attachment; filename="{_quoted(record)}"'
    return response


@blueprint.delete("/v1/files/<file_id>")
def delete_file(file_id: str) -> Response:
    store = services().files
    record = visible_file(store, file_id)
    store.delete(record)
    return jsonify({"id": record.id, "object": "file", "deleted": True})


def visible_file(store: FileStore, file_id: str, param: str = "file_id") -> FileRecord:
    """The caller's file; unknown, expired, deleted or another key's: 404 naming ``param``."""
    record = store.get(file_id)
    if record is None or not owned_by(record.owner, current_owner()):
        raise not_found(f"file {file_id!r} does not exist", param)
    return record


def _quoted(record: FileRecord) -> str:
    """The filename as a header can carry it (printable ASCII, no quote or backslash)."""
    return "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in record.filename)
