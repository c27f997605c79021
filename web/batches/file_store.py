"""Files (``/v1/files``) in Redis: a hash per file, its bytes as a list of fixed-size chunks.

Redis is the one store every part of the stack already has, so a file needs no volume shared
between web processes and no other service; its memory is the cost, bounded by
``files.max_file_bytes``, ``files.max_bytes_per_key`` and ``files.retention_seconds`` (every key
of a file carries that TTL). Chunks let an upload be written and a download be read a chunk at a
time: no web process ever holds a whole file.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, cast

import redis

from trickle import keys
from trickle.config.sections import FileSettings
from trickle.store.held_quota import HeldQuota
from web.common.response_models import FileObject, FilePurpose

CHUNK_BYTES = 262_144
FILE_ID_PATTERN = re.compile(r"file-[0-9a-f]{24}")
UPLOAD_PURPOSES = ("batch", "user_data")
MAX_FILENAME_CHARS = 512
# What a file's record and index entries cost besides its bytes and name, held with them.
RECORD_BYTES = 256
# Records read per round trip when a list pages through a key's files.
LIST_SLICE = 100
# An upload's hold lapses this long after its last chunk (its process died mid-upload).
UPLOAD_HOLD_SECONDS = 600


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def is_file_id(value: str) -> bool:
    """Whether ``value`` can name a file: anything else is a 404 before any Redis call."""
    return FILE_ID_PATTERN.fullmatch(value) is not None


@dataclass
class FileRecord:
    """A stored file's object, exactly the fields OpenAI's file object has, plus its tenant."""

    id: str
    tenant_digest: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    expires_at: int

    def to_object(self) -> FileObject:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": cast(FilePurpose, self.purpose),
            "status": "processed",
            "status_details": None,
        }

    def to_hash(self) -> dict[str, str]:
        return {name: str(value) for name, value in asdict(self).items()}

    @classmethod
    def from_hash(cls, fields: dict[str, str]) -> FileRecord:
        return cls(
            id=fields["id"],
            tenant_digest=fields.get("tenant_digest", ""),
            bytes=int(fields["bytes"]),
            created_at=int(fields["created_at"]),
            filename=fields["filename"],
            purpose=fields["purpose"],
            expires_at=int(fields["expires_at"]),
        )


class FileTooLarge(Exception):
    """A write went past the writer's limit (the file's size limit or the key's quota)."""


class FileWriter:
    """Appends a new file's bytes to its chunk list as they arrive, a chunk per RPUSH, each
    chunk's bytes held against the tenant's quota before it is written.

    The file does not exist until ``FileStore.commit`` writes its record: chunks of an upload
    that fails or whose process dies are never listed and expire with their TTL, and their
    hold lapses ``UPLOAD_HOLD_SECONDS`` after the last chunk. Has the ``write``/``seek`` a
    multipart parser's stream factory needs.
    """

    def __init__(
        self,
        client: redis.Redis,
        file_id: str,
        limit: int,
        ttl_seconds: int,
        quota: HeldQuota,
        enforce: bool = True,
        drawing_from: str = "",
    ):
        self.redis = client
        self.file_id = file_id
        self.limit = limit
        self.ttl_seconds = ttl_seconds
        self.quota = quota
        self.enforce = enforce
        self.drawing_from = drawing_from
        self.size = 0
        self._buffer = bytearray()
        self._started = False

    def open(self, filename: str) -> FileWriter:
        """Holds the record's cost (its name included) before any byte: refused past the
        key's file count or room (QuotaFull)."""
        self.hold(RECORD_BYTES + len(filename.encode()))
        return self

    def hold(self, adding: int) -> None:
        lapses_at = time.time() + UPLOAD_HOLD_SECONDS
        self.quota.hold(self.file_id, adding, lapses_at, self.enforce, self.drawing_from)

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self.limit:
            raise FileTooLarge(f"more than {self.limit} bytes")
        self._buffer += data
        while len(self._buffer) >= CHUNK_BYTES:
            self._push(bytes(self._buffer[:CHUNK_BYTES]))
            del self._buffer[:CHUNK_BYTES]
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        """The parser rewinds a finished part; the bytes are already in Redis."""
        return 0

    def finish(self) -> int:
        """Writes what is left; returns the file's size."""
        if self._buffer or not self._started:
            self._push(bytes(self._buffer))
            self._buffer.clear()
        return self.size

    def discard(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(keys.file_chunks(self.file_id))
        self.quota.release(self.file_id, pipe)
        pipe.execute()

    def _push(self, chunk: bytes) -> None:
        self.hold(len(chunk))  # QuotaFull past the key's storage, before the bytes go out
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(keys.file_chunks(self.file_id), chunk)
        if not self._started:
            pipe.expire(keys.file_chunks(self.file_id), self.ttl_seconds)
        pipe.execute()
        self._started = True


class FileStore:
    def __init__(self, client: redis.Redis, settings: FileSettings):
        self.redis = client
        self.settings = settings
        self.retention_seconds = settings.retention_seconds

    def quota(self, tenant_digest: str) -> HeldQuota:
        """The tenant's file storage: ``files.max_bytes_per_key`` and ``max_files_per_key``."""
        return HeldQuota(
            self.redis,
            keys.files_held(tenant_digest),
            keys.files_held_bytes(tenant_digest),
            self.settings.max_bytes_per_key,
            self.settings.max_files_per_key,
        )

    def writer(
        self,
        tenant_digest: str,
        filename: str,
        limit: int,
        enforce: bool = True,
        drawing_from: str = "",
    ) -> FileWriter:
        """A new file's writer, its record's cost held already (QuotaFull when refused);
        ``enforce`` False: its bytes count against the tenant's storage but are never refused
        (a batch's output, which must be kept whole); ``drawing_from``: the holder whose room
        its bytes take over first (``HeldQuota.hold``)."""
        writer = FileWriter(
            self.redis,
            new_file_id(),
            limit,
            self.retention_seconds,
            self.quota(tenant_digest),
            enforce,
            drawing_from,
        )
        return writer.open(filename)

    def record_for(
        self, writer: FileWriter, tenant_digest: str, filename: str, purpose: str
    ) -> FileRecord:
        now = int(time.time())
        return FileRecord(
            writer.file_id,
            tenant_digest,
            writer.size,
            now,
            filename,
            purpose,
            now + self.retention_seconds,
        )

    def commit(self, record: FileRecord, pipe: Any = None) -> None:
        """Makes a written file visible: its record, its place in the tenant's index, and its
        hold kept until it expires (on ``pipe`` when given, so it lands with the caller's
        other writes)."""
        own = pipe is None
        pipe = pipe if pipe is not None else self.redis.pipeline(transaction=False)
        pipe.hset(keys.file(record.id), mapping=record.to_hash())
        pipe.expire(keys.file(record.id), self.retention_seconds)
        pipe.expire(keys.file_chunks(record.id), self.retention_seconds)
        # Scored by the moment, not created_at's whole seconds: the list keeps upload order.
        pipe.zadd(keys.files_of(record.tenant_digest), {record.id: time.time()})
        pipe.expire(keys.files_of(record.tenant_digest), self.retention_seconds)
        self.quota(record.tenant_digest).keep(pipe, record.id, record.expires_at)
        if own:
            pipe.execute()

    def get(self, file_id: str) -> FileRecord | None:
        if not is_file_id(file_id):
            return None
        fields = self.redis.hgetall(keys.file(file_id))
        return FileRecord.from_hash(_text(fields)) if fields else None

    def chunks(self, file_id: str) -> Iterator[bytes]:
        """The file's bytes a chunk at a time (one round trip each); a file deleted meanwhile
        ends early."""
        index = 0
        while True:
            chunk = self.redis.lindex(keys.file_chunks(file_id), index)
            if chunk is None:
                return
            yield chunk if isinstance(chunk, bytes) else chunk.encode()
            index += 1

    def delete(self, record: FileRecord) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(keys.file(record.id), keys.file_chunks(record.id))
        pipe.zrem(keys.files_of(record.tenant_digest), record.id)
        self.quota(record.tenant_digest).release(record.id, pipe)
        pipe.execute()

    def page(
        self,
        tenant_digest: str,
        limit: int,
        after: str | None,
        newest_first: bool,
        purpose: str | None,
    ) -> list[FileRecord] | None:
        """Up to ``limit`` of the tenant's live files after the file ``after`` (None: from the
        start), and one more if more follow; None when ``after`` is not the tenant's. Records are
        read a slice at a time, never all of the key's: ids whose file expired leave the
        index."""
        index = keys.files_of(tenant_digest)
        start = 0
        if after is not None:
            rank = (self.redis.zrevrank if newest_first else self.redis.zrank)(index, after)
            if rank is None:
                return None
            start = int(rank) + 1  # type: ignore[arg-type]
        found: list[FileRecord] = []
        # A page and one more tells has_more; a filter may skip records, so it reads slices.
        read = limit + 1 if purpose is None else max(limit + 1, LIST_SLICE)
        while len(found) <= limit:
            ids = [
                _str(raw)
                for raw in self.redis.zrange(index, start, start + read - 1, desc=newest_first)
            ]
            if not ids:
                break
            live, gone = self._live(tenant_digest, ids, purpose)
            found += live
            start += len(ids) - gone  # the ids that left the index moved the rest up
        return found[: limit + 1]

    def _live(
        self, tenant_digest: str, ids: list[str], purpose: str | None
    ) -> tuple[list[FileRecord], int]:
        """The live records of ``ids`` (of ``purpose``), and how many left the index."""
        pipe = self.redis.pipeline(transaction=False)
        for file_id in ids:
            pipe.hgetall(keys.file(file_id))
        found, gone = [], []
        for file_id, fields in zip(ids, pipe.execute(), strict=True):
            if not fields:
                gone.append(file_id)
                continue
            record = FileRecord.from_hash(_text(fields))
            if purpose is None or record.purpose == purpose:
                found.append(record)
        if gone:
            self.redis.zrem(keys.files_of(tenant_digest), *gone)
        return found, len(gone)


def lines_of(
    chunks: Iterator[bytes], start: int = 0, max_line: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """(offset just past the line, the line without its "\\n") for each line of a chunked
    file from byte ``start`` on; a last line without "\\n" counts. A line longer than
    ``max_line`` comes cut to ``max_line + 1`` bytes (enough to tell it is too long): a file's
    one 60 MB line never sits whole in a web process."""
    keep = None if max_line is None else max_line + 1
    offset = 0
    carry = b""
    for chunk in chunks:
        if offset + len(chunk) <= start:
            offset += len(chunk)
            continue
        if offset < start:
            chunk = chunk[start - offset :]
            offset = start
        data = carry + chunk
        begin = 0
        while True:
            end = data.find(b"\n", begin)
            if end < 0:
                break
            # A newline is never in ``carry``, so ``end`` is in this chunk wherever carry was cut.
            yield offset - len(carry) + end + 1, data[begin:end][:keep]
            begin = end + 1
        offset += len(chunk)
        carry = data[begin:][:keep]
    if carry:
        yield offset, carry


def _text(fields: dict[Any, Any]) -> dict[str, str]:
    return {_str(k): _str(v) for k, v in fields.items()}


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def line_groups(
    chunks: Iterator[bytes], start: int, max_line: int, size: int
) -> Iterator[tuple[int, list[tuple[int, bytes]]]]:
    """``lines_of``'s non-blank lines from ``start`` in groups of ``size``, each with the offset
    read to (just past its last line); the last group, shorter (maybe empty), reads to the end:
    one walk for reading an input into jobs and for failing its unread lines."""
    read_to = start
    group: list[tuple[int, bytes]] = []
    for end, line in lines_of(chunks, start, max_line):
        read_to = end
        if line.strip():
            group.append((end, line))
        if len(group) == size:
            yield read_to, group
            group = []
    yield read_to, group
