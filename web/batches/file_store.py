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
from dataclasses import dataclass
from typing import Any, cast

import redis

from trickle import keys
from web.common.response_models import FileObject, FilePurpose

CHUNK_BYTES = 262_144
FILE_ID_PATTERN = re.compile(r"file-[0-9a-f]{24}")
UPLOAD_PURPOSES = ("batch", "user_data")


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def is_file_id(value: str) -> bool:
    """Whether ``value`` can name a file: anything else is a 404 before any Redis call."""
    return FILE_ID_PATTERN.fullmatch(value) is not None


@dataclass
class FileRecord:
    """A stored file's object, exactly the fields OpenAI's file object has, plus its owner."""

    id: str
    owner: str
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
        return {
            "id": self.id,
            "owner": self.owner,
            "bytes": str(self.bytes),
            "created_at": str(self.created_at),
            "filename": self.filename,
            "purpose": self.purpose,
            "expires_at": str(self.expires_at),
        }

    @classmethod
    def from_hash(cls, fields: dict[str, str]) -> FileRecord:
        return cls(
            id=fields["id"],
            owner=fields.get("owner", ""),
            bytes=int(fields["bytes"]),
            created_at=int(fields["created_at"]),
            filename=fields["filename"],
            purpose=fields["purpose"],
            expires_at=int(fields["expires_at"]),
        )


class FileTooLarge(Exception):
    """A write went past the writer's limit (the file's size limit or the key's quota)."""


class FileWriter:
    """Appends a new file's bytes to its chunk list as they arrive, a chunk per RPUSH.

    The file does not exist until ``FileStore.commit`` writes its record: chunks of an upload
    that fails or whose process dies are never listed and expire with their TTL. Has the
    ``write``/``seek`` a multipart parser's stream factory needs.
    """

    def __init__(self, client: redis.Redis, file_id: str, limit: int, ttl_seconds: int):
        self.redis = client
        self.file_id = file_id
        self.limit = limit
        self.ttl_seconds = ttl_seconds
        self.size = 0
        self._buffer = bytearray()
        self._started = False

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
        self.redis.delete(keys.file_chunks(self.file_id))

    def _push(self, chunk: bytes) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(keys.file_chunks(self.file_id), chunk)
        if not self._started:
            pipe.expire(keys.file_chunks(self.file_id), self.ttl_seconds)
        pipe.execute()
        self._started = True


class FileStore:
    def __init__(self, client: redis.Redis, retention_seconds: int):
        self.redis = client
        self.retention_seconds = retention_seconds

    def writer(self, limit: int) -> FileWriter:
        return FileWriter(self.redis, new_file_id(), limit, self.retention_seconds)

    def record_for(self, writer: FileWriter, owner: str, filename: str, purpose: str) -> FileRecord:
        now = int(time.time())
        return FileRecord(
            writer.file_id,
            owner,
            writer.size,
            now,
            filename,
            purpose,
            now + self.retention_seconds,
        )

    def commit(self, record: FileRecord, pipe: Any = None) -> None:
        """Makes a written file visible: its record, and its place in the owner's index (on
        ``pipe`` when given, so it lands with the caller's other writes)."""
        own = pipe is None
        pipe = pipe if pipe is not None else self.redis.pipeline(transaction=False)
        pipe.hset(keys.file(record.id), mapping=record.to_hash())
        pipe.expire(keys.file(record.id), self.retention_seconds)
        pipe.expire(keys.file_chunks(record.id), self.retention_seconds)
        # Scored by the moment, not created_at's whole seconds: the list keeps upload order.
        pipe.zadd(keys.files_of(record.owner), {record.id: time.time()})
        pipe.expire(keys.files_of(record.owner), self.retention_seconds)
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
        pipe.zrem(keys.files_of(record.owner), record.id)
        pipe.execute()

    def owned(self, owner: str) -> list[FileRecord]:
        """The owner's live files, oldest first; ids whose file expired leave the index."""
        ids = [_str(raw) for raw in self.redis.zrange(keys.files_of(owner), 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for file_id in ids:
            pipe.hgetall(keys.file(file_id))
        found, gone = [], []
        for file_id, fields in zip(ids, pipe.execute(), strict=True):
            if fields:
                found.append(FileRecord.from_hash(_text(fields)))
            else:
                gone.append(file_id)
        if gone:
            self.redis.zrem(keys.files_of(owner), *gone)
        return found

    def used_bytes(self, owner: str) -> int:
        return sum(record.bytes for record in self.owned(owner))


def lines_of(chunks: Iterator[bytes], start: int = 0) -> Iterator[tuple[int, bytes]]:
    """(offset just past the line, the line without its "\\n") for each line of a chunked
    file from byte ``start`` on; a last line without "\\n" counts."""
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
            yield offset - len(carry) + end + 1, data[begin:end]
            begin = end + 1
        offset += len(chunk)
        carry = data[begin:]
    if carry:
        yield offset, carry


def _text(fields: dict[Any, Any]) -> dict[str, str]:
    return {_str(k): _str(v) for k, v in fields.items()}


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
