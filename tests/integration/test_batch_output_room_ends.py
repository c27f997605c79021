"""How a batch's output hold ends (``web.batches.output_room``, ``web.batches.unread``): a
settle task that read the batch before another finalized it changes nothing; a batch that waits
for room past its window, or for room that can never come back, ends with its unread lines
failed, naming why, and holds nothing after; a settle pass writes only the lines newly finished,
and a group of lines that fits is held in one call. In process, on the test Redis (the fixtures
of ``test_batch_output_room``)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.file_batches import (
    FIRST,
    bearer,
    create,
    jsonl,
    line,
    post_batch,
    run_jobs,
    sweep_now,
    upload,
)
from tests.integration import test_batch_output_room as output_room_tests
from tests.integration.test_batch_output_room import (
    DIGEST,
    QUOTA,
    held,
    items,
    quota,
    small_lines,
)
from trickle import keys
from trickle.jobs import JobStatus
from trickle.store.held_quota import HeldQuota
from web.batches.finalize import batch_store, finalize, settle
from web.batches.output_room import holder_of, settle_holds
from web.batches.tasks import ingest_batch, settle_batch
from web.services import services

# Its fixtures: a key whose file storage a few lines fill, and a model no worker serves.
app = output_room_tests.app
client = output_room_tests.client


def _lines_of(client: FlaskClient, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    found = client.get(f"/v1/files/{file_id}/content", headers=bearer(FIRST))
    return [json.loads(x) for x in found.get_data(as_text=True).splitlines()]


def test_a_settle_task_that_read_the_batch_before_it_finished_changes_nothing(
    app: Flask, client: FlaskClient
) -> None:
    file_id = upload(client, small_lines(2)).get_json()["id"]
    batch = create(client, file_id).get_json()
    svc = services(app)
    store = batch_store(svc)
    stale = store.record(batch["id"])  # as a settle task read it, while it ran
    assert stale is not None and stale.stage == "in_progress"
    run_jobs(app, [job for item in items(app, batch["id"]) for job in item.job_ids])
    done = settle_batch(svc, batch["id"])
    assert done is not None and done.stage == "completed"
    used = quota(app).used()
    listed = client.get("/v1/files", headers=bearer(FIRST)).get_json()["data"]

    again = settle(svc, store, stale)[0]  # the late task, with what it read
    assert (again.stage, again.output_file_id) == ("completed", done.output_file_id)
    late = finalize(svc, store, stale, False)  # one that found the batch finished, then slept
    assert (late.stage, late.output_file_id) == ("completed", done.output_file_id)

    found = client.get(f"/v1/batches/{batch['id']}", headers=bearer(FIRST)).get_json()
    assert found["status"] == "completed" and found["output_file_id"] == done.output_file_id
    assert client.get("/v1/files", headers=bearer(FIRST)).get_json()["data"] == listed
    assert quota(app).used() == used  # no second pair of files
    assert held(app, batch["id"]) is None  # and no empty hold made again


def _ingest_run_sweep(app: Flask, client: FlaskClient, batch_id: str, text: str) -> str:
    """A turn: read what fits, the workers run it, the sweep settles; the batch's status."""
    ingest_batch(app, batch_id)
    queued = [job for item in items(app, batch_id) for job in item.job_ids
              if services(app).store.status(job) is JobStatus.QUEUED]  # fmt: skip
    run_jobs(app, queued, text=text)
    sweep_now(app, batch_id)
    return str(client.get(f"/v1/batches/{batch_id}", headers=bearer(FIRST)).get_json()["status"])


def test_a_batch_whose_finished_lines_fill_the_storage_fails_the_rest_naming_it(
    app: Flask, client: FlaskClient
) -> None:
    """Long answers: the finished lines' output alone fills the key's storage, so the lines not
    read could never find room (no line of the batch still runs to give some back)."""
    data = jsonl(*(line(f"s{i}", max_tokens=2) for i in range(20)))
    file_id = upload(client, data).get_json()["id"]
    batch_id = post_batch(client, file_id).get_json()["id"]
    statuses = [_ingest_run_sweep(app, client, batch_id, "x" * 600) for _turn in range(12)]
    assert "completed" in statuses, statuses
    found = client.get(f"/v1/batches/{batch_id}", headers=bearer(FIRST)).get_json()
    counts = found["request_counts"]
    assert counts["total"] == 20 and 0 < counts["completed"] < 20, counts
    assert counts["failed"] == 20 - counts["completed"], counts
    errors = _lines_of(client, found["error_file_id"])
    assert [error["custom_id"] for error in errors] == [
        f"s{i}" for i in range(counts["completed"], 20)
    ]
    body = errors[0]["response"]["body"]["error"]
    assert body["code"] == "file_storage_full", body
    assert "files.max_bytes_per_key" in body["message"] and "delete files" in body["message"]
    assert held(app, batch_id) is None


def test_a_batch_waits_for_a_file_that_expires_within_its_window(
    app: Flask, client: FlaskClient
) -> None:
    """The same full storage, but one of the key's files expires before the batch's window
    ends: its room will come back without the client, so the batch waits, its rest unread."""
    expiring = upload(client, b"x" * 100).get_json()["id"]
    svc = services(app)
    soon = time.time() + 600  # the file's expiry, well within the 24 h window
    svc.redis.zadd(keys.files_held(DIGEST), {expiring: soon}, xx=True)
    data = jsonl(*(line(f"s{i}", max_tokens=2) for i in range(20)))
    file_id = upload(client, data).get_json()["id"]
    batch_id = post_batch(client, file_id).get_json()["id"]
    statuses = [_ingest_run_sweep(app, client, batch_id, "x" * 600) for _turn in range(12)]
    assert set(statuses) == {"validating"}, statuses
    assert 0 < len(items(app, batch_id)) < 20


def test_a_batch_still_reading_past_its_window_expires_with_its_unread_lines(
    app: Flask, client: FlaskClient
) -> None:
    data = jsonl(*(line(f"s{i}", max_tokens=2) for i in range(20)))
    file_id = upload(client, data).get_json()["id"]
    batch_id = post_batch(client, file_id).get_json()["id"]
    ingest_batch(app, batch_id)  # reads what fits; nothing runs
    read = items(app, batch_id)
    assert 0 < len(read) < 20
    run_jobs(app, read[0].job_ids)
    svc = services(app)
    window = svc.settings.files.batch_window_seconds
    batch_store(svc).update(batch_id, created_at=time.time() - window - 1)
    sweep_now(app, batch_id)
    found = client.get(f"/v1/batches/{batch_id}", headers=bearer(FIRST)).get_json()
    assert found["status"] == "expired", found
    assert found["request_counts"] == {"total": 20, "completed": 1, "failed": 19}, found
    errors = _lines_of(client, found["error_file_id"])
    assert [error["custom_id"] for error in errors] == [f"s{i}" for i in range(1, 20)]
    assert {error["error"]["code"] for error in errors} == {"batch_expired"}
    assert all(svc.store.status(job) is not JobStatus.QUEUED for item in read
               for job in item.job_ids)  # fmt: skip
    assert held(app, batch_id) is None


def test_a_batch_whose_input_went_while_it_waited_fails_naming_it(
    app: Flask, client: FlaskClient
) -> None:
    """Its window ends while it waits for room and its input file is gone by then: the
    unread lines cannot be named, so the batch fails ``input_file_unavailable`` (never
    ``expired`` with part of its input missing from both files)."""
    data = jsonl(*(line(f"s{i}", max_tokens=2) for i in range(20)))
    file_id = upload(client, data).get_json()["id"]
    batch_id = post_batch(client, file_id).get_json()["id"]
    ingest_batch(app, batch_id)  # reads what fits; nothing runs
    assert 0 < len(items(app, batch_id)) < 20
    svc = services(app)
    svc.redis.delete(keys.file_chunks(file_id))  # expired with the window, say
    window = svc.settings.files.batch_window_seconds
    batch_store(svc).update(batch_id, created_at=time.time() - window - 1)
    sweep_now(app, batch_id)
    found = client.get(f"/v1/batches/{batch_id}", headers=bearer(FIRST)).get_json()
    assert found["status"] == "failed", found
    assert found["errors"]["data"][0]["code"] == "input_file_unavailable", found


def test_a_settle_pass_writes_only_the_lines_newly_finished(
    app: Flask, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    file_id = upload(client, small_lines(5)).get_json()["id"]
    batch = create(client, file_id).get_json()
    read = items(app, batch["id"])
    svc = services(app)
    written: list[int] = []
    give_back_once = HeldQuota.give_back_once

    def counting(self: HeldQuota, holder: str, marks: str, giving: Any, ttl: int) -> int:
        written.extend(giving)
        return give_back_once(self, holder, marks, giving, ttl)

    monkeypatch.setattr(HeldQuota, "give_back_once", counting)
    run_jobs(app, [job for item in read[:2] for job in item.job_ids])
    for _pass in range(3):
        settle_batch(svc, batch["id"])
    run_jobs(app, [job for item in read[2:4] for job in item.job_ids])
    for _pass in range(3):
        settle_batch(svc, batch["id"])
    assert sorted(written) == [0, 1, 2, 3]


def test_a_hold_lives_as_long_as_its_batch_record(app: Flask, client: FlaskClient) -> None:
    """Not a fixed time after a renewal: the workers run the jobs whether or not the batch
    consumer is up, so a consumer down for long never frees room their output will take."""
    file_id = upload(client, small_lines(2)).get_json()["id"]
    batch = create(client, file_id).get_json()
    redis_client = services(app).redis
    lapses = redis_client.zscore(keys.files_held(DIGEST), holder_of(batch["id"]))
    record_ends = time.time() + redis_client.pttl(keys.batch(batch["id"])) / 1000
    assert lapses is not None and abs(lapses - record_ends) < 5, (lapses, record_ends)
    assert lapses - time.time() > 3600


def test_a_group_that_fits_is_held_in_one_script_call(
    app: Flask, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a call per line: each call sums the key's holds, which Redis does in one go. The
    batch's creation holds its lines' error lines (one call), the group what their output
    needs besides (one more)."""
    calls: list[tuple[str, int]] = []
    hold = HeldQuota.hold

    def counting(self: HeldQuota, holder: str, adding: int, *args: Any, **kwargs: Any) -> int:
        calls.append((holder, adding))
        return hold(self, holder, adding, *args, **kwargs)

    monkeypatch.setattr(HeldQuota, "hold", counting)
    file_id = upload(client, small_lines(3)).get_json()["id"]
    batch = create(client, file_id).get_json()
    assert batch["request_counts"]["total"] == 3
    held_by_batch = [adding for holder, adding in calls if holder == holder_of(batch["id"])]
    assert len(held_by_batch) == 2 and sum(held_by_batch) == held(app, batch["id"]), calls


def test_two_batches_of_one_key_waiting_on_each_other_end_their_readings(
    app: Flask, client: FlaskClient
) -> None:
    """Two batches of one key take turns reading what fits until each waits for room with
    none of its lines running: each holds only what its finished lines wrote, which its files
    keep, so neither can give the other room. Both end their readings (the unread lines fail
    naming the storage) instead of waiting on each other until their windows end."""
    count = 10  # both batches' unread error lines fit the key's storage at once
    data = jsonl(*(line(f"s{i}") for i in range(count)))
    inputs = [upload(client, data).get_json()["id"] for _batch in range(2)]
    first, second = (post_batch(client, file_id).get_json()["id"] for file_id in inputs)
    ingest_batch(app, first)  # reads what fits
    run_jobs(app, [job for item in items(app, first) for job in item.job_ids])
    svc = services(app)
    store = batch_store(svc)
    record = store.record(first)
    assert record is not None
    settle_holds(svc, store, record)  # short answers give most of its room back...
    ingest_batch(app, second)  # ...which the second batch reads into
    for batch_id in (first, second):
        assert 0 < len(items(app, batch_id)) < count
    statuses: list[tuple[str, str]] = []
    for _turn in range(12):
        statuses.append(tuple(  # type: ignore[arg-type]
            _ingest_run_sweep(app, client, batch_id, "x" * 1200) for batch_id in (first, second)
        ))  # fmt: skip
        if statuses[-1] == ("completed", "completed"):
            break
    assert statuses[-1] == ("completed", "completed"), statuses
    for batch_id in (first, second):
        found = client.get(f"/v1/batches/{batch_id}", headers=bearer(FIRST)).get_json()
        counts = found["request_counts"]
        assert counts["total"] == count and counts["completed"] + counts["failed"] == count, counts
        assert 0 < counts["completed"] < count, counts
        errors = _lines_of(client, found["error_file_id"])
        assert {error["response"]["body"]["error"]["code"] for error in errors} == {
            "file_storage_full"
        }
        assert held(app, batch_id) is None
        assert not services(app).redis.exists(keys.batch_room_stalled(batch_id))


@pytest.mark.parametrize("batches", [1, 2])
def test_a_reading_that_ends_on_a_full_key_never_passes_its_storage(
    app: Flask, client: FlaskClient, batches: int
) -> None:
    """Long answers fill the key's storage, then the readings end with their unread lines
    failed ``file_storage_full``: those error lines were held when each batch was made, so
    the key's stored and held bytes stay within ``files.max_bytes_per_key`` at every turn
    and once the batches' files are written (error lines included)."""
    count = 20 // batches
    data = jsonl(*(line(f"s{i}", max_tokens=2) for i in range(count)))
    inputs = [upload(client, data).get_json()["id"] for _batch in range(batches)]
    ids = [post_batch(client, file_id).get_json()["id"] for file_id in inputs]
    used: list[int] = []
    for _turn in range(20):
        statuses = [_ingest_run_sweep(app, client, batch_id, "x" * 1200) for batch_id in ids]
        used.append(quota(app).used())
        if set(statuses) == {"completed"}:
            break
    assert set(statuses) == {"completed"}, statuses
    listed = client.get("/v1/files", headers=bearer(FIRST)).get_json()["data"]
    stored = sum(found["bytes"] for found in listed)
    assert max(used) <= QUOTA and stored <= quota(app).used() <= QUOTA, (used, stored)
    errors = []
    for batch_id in ids:
        found = client.get(f"/v1/batches/{batch_id}", headers=bearer(FIRST)).get_json()
        errors += _lines_of(client, found["error_file_id"])
        assert held(app, batch_id) is None
    assert errors  # the readings ended early, with lines unread
    assert {error["error"]["code"] for error in errors} == {"file_storage_full"}, errors


def test_a_batchs_files_take_its_room_over_leaving_none_to_another_writer_between(
    app: Flask, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each piece the output and error files hold moves over from the batch's hold in the
    same script call: an upload that takes every free byte before each of those holds finds
    none of the batch's room, so the key never passes its storage."""
    file_id = upload(client, small_lines(3)).get_json()["id"]
    batch = create(client, file_id).get_json()
    run_jobs(app, [job for item in items(app, batch["id"]) for job in item.job_ids])
    hold = HeldQuota.hold
    grabbed: list[int] = []

    def grabbing(self: HeldQuota, holder: str, adding: int, *args: Any, **kwargs: Any) -> int:
        enforce = kwargs.get("enforce", args[1] if len(args) > 1 else True)
        if holder.startswith("file-") and adding > 0 and not enforce:
            free = QUOTA - self.used()  # the batch's files: another writer takes what is free
            if free > 0:
                hold(self, "another-upload", free, time.time() + 600)
                grabbed.append(free)
        return hold(self, holder, adding, *args, **kwargs)

    monkeypatch.setattr(HeldQuota, "hold", grabbing)
    done = settle_batch(services(app), batch["id"])
    assert done is not None and done.stage == "completed"
    assert grabbed  # the other writer did find room to take, at the first hold
    assert quota(app).used() <= QUOTA, (quota(app).used(), grabbed)


def test_lines_that_need_no_more_room_are_read_while_the_key_is_past_its_storage(
    app: Flask, client: FlaskClient
) -> None:
    """Refused lines take no room beyond their unread error line's hold: their reading goes on
    even while the key is past its storage (a write not held to it: another batch's files),
    and each fails on its own 400 instead of waiting for room it does not need."""
    file_id = upload(client, b"{nope\n{nope too\n").get_json()["id"]
    batch_id = post_batch(client, file_id).get_json()["id"]
    quota(app).hold(f"file-{'0' * 24}", QUOTA, time.time() + 3600, enforce=False)
    ingest_batch(app, batch_id)
    assert len(items(app, batch_id)) == 2
