"""Files and file batches in process on the test Redis: ownership, limits, per-line failures,
finalization into output and error files, cancel, expiry, a reading resumed after its process
died. No worker serves ``bound``: a test runs a job as a worker would (claim, then finish), and
the batch consumer's tasks as it would (their functions, ``tests.file_batches``)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from tests.file_batches import (
    FIRST,
    SECOND,
    bearer,
    content,
    create,
    job_ids_of,
    jsonl,
    line,
    post_batch,
    run_jobs,
    settle,
    sweep_now,
    upload,
)
from trickle import keys
from trickle.config.sections import AuthSettings, FileSettings
from trickle.config.settings import Settings
from trickle.jobs import JobStatus
from trickle.tenants import digest_of_entry
from web.batches import ingest as batch_ingest
from web.batches.file_store import CHUNK_BYTES
from web.batches.tasks import ingest_batch
from web.services import services

# Small enough that no test body spills to a temporary file in Flask's test client.
MAX_FILE = 300_000
# Room for the batches' outputs, held while their lines run (output_room), besides inputs.
QUOTA = 2_000_000


@pytest.fixture(scope="module")
def file_settings(settings: Settings) -> Settings:
    bound = dataclasses.replace(settings.models["late"], name="bound")
    files = FileSettings(max_file_bytes=MAX_FILE, max_bytes_per_key=QUOTA)
    return dataclasses.replace(
        settings,
        files=files,
        models={**settings.models, "bound": bound},
        auth=AuthSettings((FIRST, SECOND)),
    )


@pytest.fixture
def app(file_settings: Settings, make_app: Callable[[Settings], Flask]) -> Iterator[Flask]:
    app = make_app(file_settings)
    yield app
    purge(app)


def purge(app: Flask) -> None:
    """The jobs and batch tasks the test sent, which nothing here consumes."""
    celery = services(app).celery
    with celery.connection_for_write() as conn:
        for queue in (keys.model_queue("bound"), keys.BATCH_QUEUE):
            celery.amqp.queues[queue].bind(conn.default_channel).purge()


@pytest.fixture
def client(app: Flask, redis_client: redis.Redis) -> Iterator[FlaskClient]:
    for key in (FIRST, SECOND):  # each test starts with an empty quota
        owner = keys.files_of(_digest(key))
        for file_id in redis_client.zrange(owner, 0, -1):
            redis_client.delete(keys.file(file_id), keys.file_chunks(file_id))
        redis_client.delete(
            owner, keys.files_held(_digest(key)), keys.files_held_bytes(_digest(key))
        )
    yield app.test_client()


def _digest(key: str) -> str:
    return digest_of_entry(key)


def test_a_file_round_trips_chunked_and_is_its_owners_alone(client: FlaskClient) -> None:
    data = bytes(range(256)) * (CHUNK_BYTES // 256 + 7)
    assert CHUNK_BYTES < len(data) < MAX_FILE  # not UTF-8, more than one chunk
    created = upload(client, data, "user_data")
    assert created.status_code == 200, created.get_data(as_text=True)
    found = created.get_json()
    assert set(found) == {
        "id", "object", "bytes", "created_at", "expires_at", "filename", "purpose", "status",
        "status_details",
    }  # fmt: skip
    assert found["id"].startswith("file-") and found["object"] == "file"
    assert (found["bytes"], found["filename"], found["purpose"]) == (
        len(data), "input.jsonl", "user_data"
    )  # fmt: skip
    assert found["expires_at"] == found["created_at"] + FileSettings().retention_seconds
    path = f"/v1/files/{found['id']}"
    assert client.get(path, headers=bearer(FIRST)).get_json() == found
    assert client.get(f"{path}/content", headers=bearer(FIRST)).get_data() == data
    listed = client.get("/v1/files", headers=bearer(FIRST)).get_json()
    assert [f["id"] for f in listed["data"]] == [found["id"]] and not listed["has_more"]
    for response in (
        client.get(path, headers=bearer(SECOND)),
        client.get(f"{path}/content", headers=bearer(SECOND)),
        client.delete(path, headers=bearer(SECOND)),
    ):
        assert response.status_code == 404
        assert response.get_json()["error"]["param"] == "file_id"
    assert client.get("/v1/files", headers=bearer(SECOND)).get_json()["data"] == []
    deleted = client.delete(path, headers=bearer(FIRST)).get_json()
    assert deleted == {"id": found["id"], "object": "file", "deleted": True}
    assert client.get(path, headers=bearer(FIRST)).status_code == 404


def test_files_list_pages_and_filters(client: FlaskClient) -> None:
    ids = [upload(client, b"x\n", purpose).get_json()["id"] for purpose in ("batch",) * 3]
    other = upload(client, b"y\n", "user_data").get_json()["id"]
    first = client.get("/v1/files?limit=2&purpose=batch", headers=bearer(FIRST)).get_json()
    assert [f["id"] for f in first["data"]] == ids[::-1][:2] and first["has_more"]
    rest = client.get(
        f"/v1/files?limit=2&purpose=batch&after={first['last_id']}", headers=bearer(FIRST)
    ).get_json()
    assert [f["id"] for f in rest["data"]] == [ids[0]] and not rest["has_more"]
    everything = client.get("/v1/files?order=asc", headers=bearer(FIRST)).get_json()
    assert [f["id"] for f in everything["data"]] == [*ids, other]
    for query, param in (("limit=0", "limit"), ("order=up", "order"), ("after=file-x", "after")):
        response = client.get(f"/v1/files?{query}", headers=bearer(FIRST))
        assert response.status_code == 400 and response.get_json()["error"]["param"] == param


def test_bad_uploads_name_the_field_and_store_nothing(
    client: FlaskClient, redis_client: redis.Redis
) -> None:
    def refused(response: Any, status: int, param: str) -> None:
        assert response.status_code == status, response.get_data(as_text=True)
        assert response.get_json()["error"]["param"] == param

    refused(upload(client, b"x\n", "fine-tuning"), 400, "purpose")
    refused(upload(client, b"x" * (MAX_FILE + 1)), 413, "file")
    refused(client.post("/v1/files", data={"purpose": "batch"}, headers=bearer(FIRST)), 400, "file")
    refused(client.post("/v1/files", json={"purpose": "batch"}, headers=bearer(FIRST)), 400, "file")
    crowded = {f"extra{i}": "x" for i in range(9)} | {"purpose": "batch"}
    multipart = "multipart/form-data"
    crowding = client.post("/v1/files", data=crowded, headers=bearer(FIRST), content_type=multipart)
    refused(crowding, 400, "body")
    assert client.get("/v1/files", headers=bearer(FIRST)).get_json()["data"] == []
    # A part without a filename (curl -F file=<x) is a file all the same.
    plain = client.post(
        "/v1/files", data={"purpose": "batch", "file": "a\n"}, headers=bearer(FIRST),
        content_type=multipart,
    )  # fmt: skip
    assert plain.status_code == 200, plain.get_data(as_text=True)
    assert plain.get_json()["bytes"] == 2
    client.delete(f"/v1/files/{plain.get_json()['id']}", headers=bearer(FIRST))
    # The per-key quota: six files fit, a seventh does not; another key still has room.
    for _ in range(6):
        assert upload(client, b"x" * 290_000).status_code == 200
    over = upload(client, b"x" * 290_000)
    refused(over, 413, "file")
    assert "remaining file storage" in over.get_json()["error"]["message"]
    assert upload(client, b"x" * 290_000, key=SECOND).status_code == 200
    assert not [k for k in redis_client.scan_iter("trickle:file:*:chunks") if not
                redis_client.exists(k.removesuffix(":chunks"))]  # fmt: skip


def test_a_file_batch_fails_bad_lines_alone_and_ends_in_two_files(
    app: Flask, client: FlaskClient, redis_client: redis.Redis
) -> None:
    data = jsonl(
        line("a"),
        "{not json",
        line("b", url="/v1/completions"),  # not the batch's endpoint
        line("a"),  # a repeated custom_id
        line("c", max_tokens=10**6),  # refused as the endpoint would refuse it
        line("d", n=2),
        line("e", model="no-such-model"),
    )
    file_id = upload(client, data).get_json()["id"]
    created = create(client, file_id, metadata={"team": "x"})
    assert created.status_code == 200, created.get_data(as_text=True)
    batch = created.get_json()
    assert batch["status"] == "in_progress" and batch["input_file_id"] == file_id
    assert batch["metadata"] == {"team": "x"} and batch["completion_window"] == "24h"
    assert batch["request_counts"] == {"total": 7, "completed": 0, "failed": 5}
    assert batch["expires_at"] == batch["created_at"] + 86_400
    assert batch["in_progress_at"] is not None and batch["output_file_id"] is None
    job_ids = job_ids_of(app, batch["id"])
    assert len(job_ids) == 3  # a: 1, d: 2 (n=2)
    for job_id in job_ids:  # the batch's window, not limits.result_ttl_seconds
        kept = 86_400 + services(app).settings.limits.result_ttl_seconds
        assert redis_client.hget(keys.job(job_id), "result_ttl") == str(kept)
    run_jobs(app, job_ids)
    assert redis_client.ttl(keys.job(job_ids[0])) > services(app).settings.limits.result_ttl_seconds
    read = client.get(f"/v1/batches/{batch['id']}", headers=bearer(FIRST)).get_json()
    assert read["status"] == "in_progress" and read["output_file_id"] is None  # reads only
    # A read answers the counts the tasks last kept: the reading's, until a settle task's.
    assert read["request_counts"] == {"total": 7, "completed": 0, "failed": 5}
    done = settle(client, batch["id"]).get_json()
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 7, "completed": 2, "failed": 5}
    assert done["finalizing_at"] is not None and done["completed_at"] is not None
    output = content(client, done["output_file_id"])
    assert [x["custom_id"] for x in output] == ["a", "d"]
    assert output[0]["response"]["status_code"] == 200 and output[0]["error"] is None
    assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == "ok"
    assert len(output[1]["response"]["body"]["choices"]) == 2
    errors = content(client, done["error_file_id"])
    assert [x["custom_id"] for x in errors] == [None, None, "a", "c", "e"]
    params = [x["response"]["body"]["error"]["param"] for x in errors]
    assert params[:4] == ["line 2", "line 3.url", "line 4.custom_id", "max_tokens"]
    assert all(x["response"]["status_code"] in (400, 404) for x in errors)
    outputs = client.get(f"/v1/files/{done['output_file_id']}", headers=bearer(FIRST)).get_json()
    assert outputs["purpose"] == "batch_output"
    # The same batch read again: final, the same files.
    again = client.get(f"/v1/batches/{batch['id']}", headers=bearer(FIRST)).get_json()
    assert again == done


def test_the_post_answers_validating_and_the_batch_task_reads_the_input(
    app: Flask, client: FlaskClient, redis_client: redis.Redis
) -> None:
    file_id = upload(client, jsonl(line("a"), line("b"))).get_json()["id"]
    answered = post_batch(client, file_id).get_json()
    assert answered["status"] == "validating" and answered["request_counts"]["total"] == 0
    assert job_ids_of(app, answered["id"]) == []
    path = f"/v1/batches/{answered['id']}"
    assert client.get(path, headers=bearer(FIRST)).get_json() == answered  # a read reads only
    celery = services(app).celery  # the reading went to the batch queue
    with celery.connection_for_write() as conn:
        assert conn.default_channel.client.llen(keys.BATCH_QUEUE) >= 1
    found = ingest_batch(app, answered["id"])
    assert found is not None and found.stage == "in_progress"
    assert len(job_ids_of(app, answered["id"])) == 2
    assert ingest_batch(app, answered["id"]) == found  # run again: nothing more is read
    assert len(job_ids_of(app, answered["id"])) == 2
    purge(app)


def test_bad_batch_requests_name_the_field(client: FlaskClient) -> None:
    good = upload(client, jsonl(line("a"))).get_json()["id"]
    deleted = upload(client, jsonl(line("a"))).get_json()["id"]
    client.delete(f"/v1/files/{deleted}", headers=bearer(FIRST))
    user_data = upload(client, jsonl(line("a")), "user_data").get_json()["id"]
    others = upload(client, jsonl(line("a")), key=SECOND).get_json()["id"]
    for response, status, param in (
        (create(client, "file-" + "0" * 24), 404, "input_file_id"),
        (create(client, "nonsense"), 404, "input_file_id"),
        (create(client, deleted), 404, "input_file_id"),
        (create(client, others), 404, "input_file_id"),
        (create(client, user_data), 400, "input_file_id"),
        (create(client, good, endpoint="/v1/embeddings"), 400, "endpoint"),
        (create(client, good, completion_window="1h"), 400, "completion_window"),
        (create(client, good, metadata={"k": 1}), 400, "metadata.k"),
        (create(client, good, priority=1), 400, "priority"),
        (create(client, 7), 400, "input_file_id"),
    ):
        assert response.status_code == status, response.get_data(as_text=True)
        assert response.get_json()["error"]["param"] == param


def test_an_empty_input_makes_a_failed_batch(client: FlaskClient) -> None:
    file_id = upload(client, b"\n\n").get_json()["id"]
    batch = create(client, file_id).get_json()
    assert batch["status"] == "failed" and batch["failed_at"] is not None
    assert batch["errors"]["data"][0]["code"] == "empty_file"


def test_batches_list_in_pages_newest_first(client: FlaskClient) -> None:
    file_id = upload(client, jsonl(line("a")), key=SECOND).get_json()["id"]
    made = [create(client, file_id, key=SECOND).get_json()["id"] for _ in range(3)]
    first = client.get("/v1/batches?limit=2", headers=bearer(SECOND)).get_json()
    assert first["object"] == "list" and first["has_more"]
    assert [b["id"] for b in first["data"]] == made[::-1][:2]
    rest = client.get(f"/v1/batches?limit=2&after={first['last_id']}", headers=bearer(SECOND))
    assert [b["id"] for b in rest.get_json()["data"]] == [made[0]]
    assert not rest.get_json()["has_more"]
    assert made[0] not in str(client.get("/v1/batches", headers=bearer(FIRST)).get_json())


def test_a_cancelled_batch_ends_cancelled_with_its_lines_in_the_error_file(
    app: Flask, client: FlaskClient
) -> None:
    file_id = upload(client, jsonl(line("a"), line("b"))).get_json()["id"]
    batch = create(client, file_id).get_json()
    run_jobs(app, job_ids_of(app, batch["id"])[:1])
    cancelled = client.post(f"/v1/batches/{batch['id']}/cancel", headers=bearer(FIRST))
    assert cancelled.get_json()["status"] == "cancelling"  # the settle task writes the files
    found = settle(client, batch["id"]).get_json()
    assert found["status"] == "cancelled", found  # b was queued: canceled at once
    assert found["cancelling_at"] is not None and found["cancelled_at"] is not None
    assert found["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    assert [x["custom_id"] for x in content(client, found["output_file_id"])] == ["a"]
    (error,) = content(client, found["error_file_id"])
    assert error["custom_id"] == "b" and error["error"]["code"] == "batch_cancelled"


def test_a_batch_past_its_window_expires(
    file_settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    files = dataclasses.replace(file_settings.files, batch_window_seconds=1)
    app = make_app(dataclasses.replace(file_settings, files=files))
    client = app.test_client()
    file_id = upload(client, jsonl(line("a"), line("b"))).get_json()["id"]
    batch = create(client, file_id).get_json()
    run_jobs(app, job_ids_of(app, batch["id"])[:1])
    time.sleep(1.1)
    found = settle(client, batch["id"]).get_json()
    assert found["status"] == "expired" and found["expired_at"] is not None
    assert [x["custom_id"] for x in content(client, found["output_file_id"])] == ["a"]
    (error,) = content(client, found["error_file_id"])
    assert error["error"]["code"] == "batch_expired"
    second = services(app).store.get(job_ids_of(app, batch["id"])[1])
    assert second is not None and second.status is JobStatus.CANCELED
    purge(app)


def test_a_reading_cut_short_is_resumed_and_reads_every_line_once(
    app: Flask, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = batch_ingest.INGEST_LINES * 2 + 50
    file_id = upload(client, jsonl(*(line(f"r{i}") for i in range(count)))).get_json()["id"]
    real = batch_ingest._write_group
    groups = []

    def dies_after_one(*args: Any) -> Any:
        if groups:
            raise RuntimeError("the batch task's process died here")
        groups.append(1)
        return real(*args)

    monkeypatch.setattr(batch_ingest, "_write_group", dies_after_one)
    batch_id = post_batch(client, file_id).get_json()["id"]
    with pytest.raises(RuntimeError):
        ingest_batch(app, batch_id)
    monkeypatch.setattr(batch_ingest, "_write_group", real)
    path = f"/v1/batches/{batch_id}"
    cut = client.get(path, headers=bearer(FIRST)).get_json()
    assert (
        cut["status"] == "validating"
        and cut["request_counts"]["total"] == batch_ingest.INGEST_LINES
    )
    assert sweep_now(app, batch_id) == [keys.BATCH_INGEST_TASK]  # the sweep resumes it
    resumed = client.get(path, headers=bearer(FIRST)).get_json()
    assert resumed["status"] == "in_progress" and resumed["request_counts"]["total"] == count
    entries = services(app).redis.lrange(keys.batch_items(batch_id), 0, -1)
    assert [json.loads(x)["custom_id"] for x in entries] == [f"r{i}" for i in range(count)]
    assert len(set(job_ids_of(app, batch_id))) == count


def test_two_readings_of_one_batch_write_each_line_once(
    app: Flask, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reading too slow to renew its lease meets the one the sweep started meanwhile: each
    group is written by one of them, and the other takes its jobs back and stops."""
    count = batch_ingest.INGEST_LINES * 2 + 30
    file_id = upload(client, jsonl(*(line(f"t{i}") for i in range(count)))).get_json()["id"]
    batch_id = post_batch(client, file_id).get_json()["id"]
    real = batch_ingest._write_group

    def slow_first(*args: Any) -> Any:
        monkeypatch.setattr(batch_ingest, "_write_group", real)
        services(app).redis.delete(keys.batch_ingest(batch_id))  # its lease lapsed
        ingest_batch(app, batch_id)  # the sweep's reading, to the end
        return real(*args)  # the slow one's first group, too late

    store = services(app).store
    delete_unpublished = store.delete_unpublished
    taken: list[str] = []

    def take_back(job_ids: list[str], *rest: Any) -> None:
        taken.extend(job_ids)
        delete_unpublished(job_ids, *rest)

    monkeypatch.setattr(batch_ingest, "_write_group", slow_first)
    monkeypatch.setattr(store, "delete_unpublished", take_back)
    found = ingest_batch(app, batch_id)
    assert found is not None and (found.stage, found.total) == ("in_progress", count)
    entries = services(app).redis.lrange(keys.batch_items(batch_id), 0, -1)
    assert [json.loads(x)["custom_id"] for x in entries] == [f"t{i}" for i in range(count)]
    named = set(job_ids_of(app, batch_id))
    assert len(named) == count and len(taken) == batch_ingest.INGEST_LINES
    assert not named & set(taken) and not any(store.get(job_id) for job_id in taken)
    purge(app)


def test_a_jsonl_body_batch_ends_in_files_too(app: Flask, client: FlaskClient) -> None:
    body = jsonl(line("a", url="/v1/completions"), line("b", url="/v1/completions", n=0))
    batch = client.post("/v1/batches", data=body, headers=bearer(FIRST)).get_json()
    assert batch["status"] == "validating" and batch["request_counts"]["total"] == 0
    # The body is the batch's input file, read by the batch consumer as an uploaded one.
    source = client.get(f"/v1/files/{batch['input_file_id']}", headers=bearer(FIRST)).get_json()
    assert source["purpose"] == "batch" and source["bytes"] == len(body)
    assert source["filename"] == f"{batch['id']}_input.jsonl"
    assert sweep_now(app, batch["id"]) == [keys.BATCH_INGEST_TASK]
    read = client.get(f"/v1/batches/{batch['id']}", headers=bearer(FIRST)).get_json()
    assert read["status"] == "in_progress" and read["endpoint"] == "/v1/completions"
    assert read["request_counts"] == {"total": 2, "completed": 0, "failed": 1}
    run_jobs(app, job_ids_of(app, batch["id"]))
    assert sweep_now(app, batch["id"]) == [keys.BATCH_SETTLE_TASK]
    done = client.get(f"/v1/batches/{batch['id']}", headers=bearer(FIRST)).get_json()
    assert done["status"] == "completed" and done["request_counts"]["failed"] == 1
    assert [x["custom_id"] for x in content(client, done["output_file_id"])] == ["a"]
    legacy = client.get(f"/v1/batches/{batch['id']}/output", headers=bearer(FIRST))
    assert [json.loads(x)["custom_id"] for x in legacy.get_data(as_text=True).splitlines()] == [
        "a", "b"
    ]  # fmt: skip
    assert legacy.headers["X-Batch-Status"] == "completed"


def test_a_cancel_while_the_input_is_read_stops_the_reading_and_its_jobs(
    app: Flask, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = batch_ingest.INGEST_LINES * 3
    file_id = upload(client, jsonl(*(line(f"c{i}") for i in range(count)))).get_json()["id"]
    real = batch_ingest._write_group

    def cancelled_meanwhile(svc: Any, store: Any, batch: Any, *rest: Any) -> Any:
        written = real(svc, store, batch, *rest)
        store.mark_cancelled(batch.id, time.time())  # a cancel from another request
        return written

    monkeypatch.setattr(batch_ingest, "_write_group", cancelled_meanwhile)
    batch = settle(client, create(client, file_id).get_json()["id"]).get_json()
    assert batch["status"] == "cancelled", batch
    assert batch["request_counts"] == {
        "total": batch_ingest.INGEST_LINES, "completed": 0, "failed": batch_ingest.INGEST_LINES
    }  # fmt: skip
    jobs = [services(app).store.get(job_id) for job_id in job_ids_of(app, batch["id"])]
    assert {job.status for job in jobs if job is not None} == {JobStatus.CANCELED}


def test_an_idempotency_key_makes_one_file_batch(app: Flask, client: FlaskClient) -> None:
    file_id = upload(client, jsonl(line("a"), line("b"))).get_json()["id"]
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    headers = {**bearer(FIRST), "Idempotency-Key": f"once-{time.time()}"}
    first = client.post("/v1/batches", json=body, headers=headers).get_json()
    again = client.post("/v1/batches", json=body, headers=headers).get_json()
    assert again["id"] == first["id"]
    ingest_batch(app, first["id"])  # each POST sent the reading: it runs once
    ingest_batch(app, first["id"])
    assert len(job_ids_of(app, first["id"])) == 2
    changed = client.post("/v1/batches", json={**body, "metadata": {"x": "y"}}, headers=headers)
    assert changed.status_code == 422


def test_an_input_file_cannot_be_deleted_while_its_batch_reads_it(
    app: Flask, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe: deleting the input mid-read ended the batch ``completed`` with 1,951 of
    5,000 lines and no error. The delete is refused (409) while the batch reads; once it is
    in_progress the file may go."""
    count = batch_ingest.INGEST_LINES * 2 + 10
    file_id = upload(client, jsonl(*(line(f"d{i}") for i in range(count)))).get_json()["id"]
    real = batch_ingest._write_group
    deletes: list[Any] = []

    def delete_between_groups(*args: Any) -> Any:
        if not deletes:
            deletes.append(app.test_client().delete(f"/v1/files/{file_id}", headers=bearer(FIRST)))
        return real(*args)

    monkeypatch.setattr(batch_ingest, "_write_group", delete_between_groups)
    batch = create(client, file_id).get_json()
    assert deletes[0].status_code == 409, deletes[0].get_data(as_text=True)
    error = deletes[0].get_json()["error"]
    assert (error["code"], error["param"]) == ("file_in_use", "file_id")
    assert batch["status"] == "in_progress" and batch["request_counts"]["total"] == count
    assert client.delete(f"/v1/files/{file_id}", headers=bearer(FIRST)).status_code == 200
    purge(app)


def test_a_batch_whose_input_goes_mid_read_fails_naming_it(
    app: Flask, client: FlaskClient, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An input that goes anyway (it expired, or a delete raced the batch's start) fails the
    batch with a named error and stops the jobs of the lines read: never a silent cut."""
    count = batch_ingest.INGEST_LINES * 2 + 10
    padding = "u" * 520  # two chunks: the second is read after the first group
    data = jsonl(*(line(f"e{i}", user=padding) for i in range(count)))
    assert CHUNK_BYTES < len(data) < MAX_FILE
    file_id = upload(client, data).get_json()["id"]
    real = batch_ingest._write_group
    groups: list[int] = []

    def expire_after_one(*args: Any) -> Any:
        found = real(*args)
        if not groups:
            redis_client.delete(keys.file(file_id), keys.file_chunks(file_id))
        groups.append(1)
        return found

    monkeypatch.setattr(batch_ingest, "_write_group", expire_after_one)
    batch = create(client, file_id).get_json()
    assert batch["status"] == "failed", batch
    (error,) = batch["errors"]["data"]
    assert (error["code"], error["param"]) == ("input_file_unavailable", "input_file_id")
    first_job = services(app).store.get(job_ids_of(app, batch["id"])[0])
    assert first_job is not None and first_job.status is JobStatus.CANCELED
    purge(app)
