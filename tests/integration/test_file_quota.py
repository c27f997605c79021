"""A key's file storage: bytes held before they are written, names and records counted, a
cap on files, lists read a page at a time (audit holes 3 and 5).

The probes: six concurrent 52 MiB uploads all got 200, 313 MiB against a 256 MiB quota (the
used bytes read once, nothing reserved); 300 empty files named with 490,000 characters took
142 MiB of Redis while the key's storage read 0; ``GET /v1/files?limit=1`` loaded every record
of the key."""

from __future__ import annotations

import dataclasses
import io
import threading
from collections.abc import Callable, Iterator

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from tests.file_batches import FIRST, SECOND, bearer, upload
from trickle import keys
from trickle.config.sections import AuthSettings, FileSettings
from trickle.config.settings import Settings
from trickle.tenants import digest_of_entry
from web.batches import file_store
from web.services import services

QUOTA = 500_000
MAX_FILES = 5


@pytest.fixture(scope="module")
def quota_settings(settings: Settings) -> Settings:
    files = FileSettings(
        max_file_bytes=200_000, max_bytes_per_key=QUOTA, max_files_per_key=MAX_FILES
    )
    return dataclasses.replace(settings, files=files, auth=AuthSettings((FIRST, SECOND)))


@pytest.fixture
def app(
    quota_settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> Iterator[Flask]:
    for key in (FIRST, SECOND):
        tenant_digest = digest_of_entry(key)
        index = keys.files_of(tenant_digest)
        for file_id in redis_client.zrange(index, 0, -1):
            redis_client.delete(keys.file(str(file_id)), keys.file_chunks(str(file_id)))
        redis_client.delete(
            index, keys.files_held(tenant_digest), keys.files_held_bytes(tenant_digest)
        )
    yield make_app(quota_settings)


def named(client: FlaskClient, name: str, data: bytes = b"", key: str = FIRST):  # type: ignore[no-untyped-def]
    form = {"purpose": "user_data", "file": (io.BytesIO(data), name)}
    return client.post("/v1/files", data=form, headers=bearer(key))


def test_concurrent_uploads_never_pass_the_quota(app: Flask, redis_client: redis.Redis) -> None:
    start = threading.Barrier(4)
    statuses: list[int] = []

    def send() -> None:
        client = app.test_client()
        start.wait()
        statuses.append(upload(client, b"x" * 190_000, "user_data").status_code)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200, 200, 413, 413], statuses
    held = services(app).files.quota(digest_of_entry(FIRST)).used()
    assert 380_000 < held <= QUOTA
    tenant_digest = digest_of_entry(FIRST)
    stored = sum(
        int(redis_client.hget(keys.file(str(file_id)), "bytes") or 0)
        for file_id in redis_client.zrange(keys.files_of(tenant_digest), 0, -1)
    )
    assert stored == 380_000
    orphans = [
        name
        for name in redis_client.scan_iter(f"{keys.PREFIX}:file:*:chunks", count=1000)
        if not redis_client.exists(str(name).removesuffix(":chunks"))
    ]
    assert not orphans  # the refused uploads' chunks went with them


def test_names_and_records_count_and_the_files_are_capped(app: Flask) -> None:
    client = app.test_client()
    too_long = named(client, "n" * (file_store.MAX_FILENAME_CHARS + 1))
    assert too_long.status_code == 400
    assert too_long.get_json()["error"]["param"] == "file"
    made = [named(client, "n" * file_store.MAX_FILENAME_CHARS) for _ in range(MAX_FILES)]
    assert [response.status_code for response in made] == [200] * MAX_FILES
    held = services(app).files.quota(digest_of_entry(FIRST)).used()
    assert held == MAX_FILES * (file_store.RECORD_BYTES + file_store.MAX_FILENAME_CHARS)
    refused = named(client, "one-more")
    assert refused.status_code == 429
    error = refused.get_json()["error"]
    assert error["param"] == "file" and "files.max_files_per_key" in error["message"]
    assert named(client, "theirs", key=SECOND).status_code == 200  # another key's room
    gone = made[0].get_json()["id"]
    assert client.delete(f"/v1/files/{gone}", headers=bearer(FIRST)).status_code == 200
    assert named(client, "after-a-delete").status_code == 200  # a delete gives the room back


def test_a_list_reads_one_page_of_records(app: Flask, monkeypatch: pytest.MonkeyPatch) -> None:
    client = app.test_client()
    ids = [named(client, f"f{i}").get_json()["id"] for i in range(MAX_FILES)]
    read: list[str] = []
    original = file_store.FileRecord.from_hash

    def counted(fields: dict[str, str]) -> file_store.FileRecord:
        read.append(fields["id"])
        return original(fields)

    monkeypatch.setattr(file_store.FileRecord, "from_hash", counted)
    first = client.get("/v1/files?limit=1", headers=bearer(FIRST)).get_json()
    assert [x["id"] for x in first["data"]] == [ids[-1]] and first["has_more"] is True
    assert len(read) <= 2  # the page and one more, never the key's every record
    pages, after = [], None
    while True:
        query = "/v1/files?limit=2&order=asc" + (f"&after={after}" if after else "")
        page = client.get(query, headers=bearer(FIRST)).get_json()
        pages += [x["id"] for x in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert pages == ids
    unknown = client.get("/v1/files?after=file-" + "0" * 24, headers=bearer(FIRST))
    assert unknown.status_code == 400 and unknown.get_json()["error"]["param"] == "after"


def test_a_batch_waits_for_room_for_its_output(app: Flask, redis_client: redis.Redis) -> None:
    """Outputs count against the key's storage and are never refused, so a batch is refused
    while the key's files fill it (the probe: two 448-byte lines made a 3.2 MiB output file,
    outside the quota)."""
    client = app.test_client()
    for _ in range(2):
        assert upload(client, b"x" * 190_000, "user_data").status_code == 200
    held = keys.files_held_bytes(digest_of_entry(FIRST))
    first = redis_client.hkeys(held)[0]
    redis_client.hincrby(held, first, QUOTA)  # the key's outputs filled its storage
    body = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n'
    refused = client.post("/v1/batches", data=body, headers=bearer(FIRST))
    assert refused.status_code == 429
    error = refused.get_json()["error"]
    assert (error["code"], error["param"]) == ("file_storage_full", "input")
    assert "files.max_bytes_per_key" in error["message"]


def test_a_jsonl_body_takes_its_room_as_an_upload_does(app: Flask) -> None:
    """A batch's JSONL body is stored as its input file: with less room left than the body,
    the batch is a 429 naming ``input`` and the key's storage stays within its quota (it was
    stored whatever the room)."""
    client = app.test_client()
    for _ in range(2):
        assert upload(client, b"x" * 190_000, "user_data").status_code == 200
    quota = services(app).files.quota(digest_of_entry(FIRST))
    before = quota.used()
    prompt = "word " * 10_000  # lines within web.max_body_bytes
    line = (
        '{"custom_id": "%s", "method": "POST", "url": "/v1/completions", '
        '"body": {"model": "late", "prompt": "%s", "max_tokens": 2}}\n'
    )
    body = "".join(line % (f"r{i}", prompt) for i in range(3)).encode()
    assert QUOTA - before < len(body) < 2 * (QUOTA - before)
    refused = client.post("/v1/batches", data=body, headers=bearer(FIRST))
    assert refused.status_code == 429, refused.get_data(as_text=True)
    error = refused.get_json()["error"]
    assert (error["code"], error["param"]) == ("file_storage_full", "input"), error
    assert "files.max_bytes_per_key" in error["message"], error
    assert quota.used() == before  # no input file left behind, nothing held
    fits = "".join(line % (f"r{i}", "hi") for i in range(2)).encode()
    made = client.post("/v1/batches", data=fits, headers=bearer(FIRST))
    assert made.status_code == 200, made.get_data(as_text=True)
    assert quota.used() <= QUOTA
