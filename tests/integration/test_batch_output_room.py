"""A batch's output held against its key's file storage (``web.batches.output_room``): each
line's projected output is held before its jobs are sent, replaced by the bytes its output line
takes once it finishes, given over to the output files and dropped with the final stage (or
with a cancel's), and it lapses by itself; a line that does not fit waits, one that never can
fails naming ``files.max_bytes_per_key``, and two batches reading at once never pass the quota.
In process, on the test Redis; no worker serves ``bound``: jobs are run as a worker would
(``run_jobs``)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from tests.file_batches import (
    FIRST,
    bearer,
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
from trickle.events import TokenEvent, alternative_text
from trickle.jobs import FinishReason, JobStatus, Usage
from trickle.store.held_quota import HeldQuota, QuotaFull
from trickle.tenants import digest_of_entry
from web.batches.finalize import batch_store
from web.batches.lines import jobs_for_item
from web.batches.output import output_line
from web.batches.output_room import (
    encoded_line,
    files_overhead,
    holder_of,
    line_bound,
    output_quota,
)
from web.batches.store import BatchItem, BatchRecord
from web.batches.tasks import ingest_batch
from web.services import services

QUOTA = 24_000
DIGEST = digest_of_entry(FIRST)


@pytest.fixture
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Iterator[Flask]:
    bound = dataclasses.replace(settings.models["late"], name="bound")
    files = FileSettings(max_file_bytes=QUOTA, max_bytes_per_key=QUOTA)
    app = make_app(
        dataclasses.replace(
            settings, files=files, models={**settings.models, "bound": bound},
            auth=AuthSettings((FIRST,)),
        )
    )  # fmt: skip
    yield app
    celery = services(app).celery
    with celery.connection_for_write() as conn:
        for queue in (keys.model_queue("bound"), keys.BATCH_QUEUE):
            celery.amqp.queues[queue].bind(conn.default_channel).purge()


@pytest.fixture
def client(app: Flask, redis_client: redis.Redis) -> FlaskClient:
    owner = keys.files_of(DIGEST)  # each test starts with an empty quota
    for file_id in redis_client.zrange(owner, 0, -1):
        redis_client.delete(keys.file(file_id), keys.file_chunks(file_id))
    redis_client.delete(owner, keys.files_held(DIGEST), keys.files_held_bytes(DIGEST))
    return app.test_client()


def quota(app: Flask) -> HeldQuota:
    return output_quota(services(app), DIGEST)


def held(app: Flask, batch_id: str) -> int | None:
    found = services(app).redis.hget(keys.files_held_bytes(DIGEST), holder_of(batch_id))
    return None if found is None else int(found)


def items(app: Flask, batch_id: str) -> list[BatchItem]:
    return batch_store(services(app)).items(batch_id, 0, 1000)


def small_lines(count: int, tag: str = "s") -> bytes:
    return jsonl(*(line(f"{tag}{i}", max_tokens=2) for i in range(count)))


def test_a_lines_hold_is_taken_before_its_jobs_then_becomes_what_it_wrote(
    app: Flask, client: FlaskClient
) -> None:
    file_id = upload(client, small_lines(2)).get_json()["id"]
    batch = create(client, file_id).get_json()
    first, second = items(app, batch["id"])
    assert first.job_ids and second.job_ids  # the jobs were sent, their room held before
    overhead = files_overhead(batch["id"])
    assert held(app, batch["id"]) == overhead + first.output_hold + second.output_hold

    run_jobs(app, first.job_ids, text="a fine answer")
    assert settle(client, batch["id"]).get_json()["status"] == "in_progress"
    after_first = held(app, batch["id"])
    assert after_first is not None and after_first < overhead + 2 * first.output_hold

    run_jobs(app, second.job_ids)
    done = settle(client, batch["id"]).get_json()
    assert done["status"] == "completed"
    assert held(app, batch["id"]) is None  # the output file holds its own bytes now
    raw = client.get(f"/v1/files/{done['output_file_id']}/content", headers=bearer(FIRST))
    written = raw.get_data().splitlines(keepends=True)
    # The first line's hold had become exactly the bytes its output line takes.
    assert after_first == overhead + len(written[0]) + second.output_hold
    # The key's storage holds its two files now, nothing more: what they take, records included.
    listed = client.get("/v1/files", headers=bearer(FIRST)).get_json()["data"]
    records = quota(app).used() - sum(found["bytes"] for found in listed)
    assert 0 < records <= 2 * 1024, records


def test_lines_wait_for_room_and_one_past_the_whole_storage_fails_naming_it(
    app: Flask, client: FlaskClient
) -> None:
    huge = line("huge", max_tokens=1024, logprobs=True, top_logprobs=20)
    data = jsonl(huge, *(line(f"s{i}", max_tokens=2) for i in range(16)))
    file_id = upload(client, data).get_json()["id"]
    batch_id = post_batch(client, file_id).get_json()["id"]
    used: list[int] = []
    for _turn in range(20):  # each turn: read what fits, the workers run it, the sweep settles
        ingest_batch(app, batch_id)
        used.append(quota(app).used())
        run_jobs(app, [job for item in items(app, batch_id)[1:] for job in item.job_ids
                       if services(app).store.status(job) is JobStatus.QUEUED])  # fmt: skip
        sweep_now(app, batch_id)
        found = client.get(f"/v1/batches/{batch_id}", headers=bearer(FIRST)).get_json()
        if found["status"] == "completed":
            break
    assert found["status"] == "completed", found
    assert max(used) <= QUOTA, used
    assert found["request_counts"] == {"total": 17, "completed": 16, "failed": 1}, found
    assert len(set(used)) > 2 and min(used) < QUOTA  # lines waited, then ran as room came back
    errors = client.get(f"/v1/files/{found['error_file_id']}/content", headers=bearer(FIRST))
    (error,) = [json.loads(x) for x in errors.get_data(as_text=True).splitlines()]
    body = error["response"]["body"]["error"]
    assert error["custom_id"] == "huge" and error["response"]["status_code"] == 400
    assert body["code"] == "output_exceeds_file_storage", body
    assert body["param"] == "line 1.body.max_tokens"
    assert f"files.max_bytes_per_key is {QUOTA}" in body["message"]


def test_a_cancelled_batch_releases_what_it_holds(app: Flask, client: FlaskClient) -> None:
    file_id = upload(client, small_lines(3)).get_json()["id"]
    batch = create(client, file_id).get_json()
    assert (held(app, batch["id"]) or 0) > 3 * 1000
    cancel = client.post(f"/v1/batches/{batch['id']}/cancel", headers=bearer(FIRST))
    assert cancel.get_json()["status"] == "cancelling"
    assert settle(client, batch["id"]).get_json()["status"] == "cancelled"
    assert held(app, batch["id"]) is None
    listed = client.get("/v1/files", headers=bearer(FIRST)).get_json()["data"]
    assert quota(app).used() <= sum(found["bytes"] for found in listed) + 2 * 1024


def test_a_hold_lapses_with_its_batch_record(app: Flask, client: FlaskClient) -> None:
    """The batch expired (its record with it) before anything gave its hold back."""
    file_id = upload(client, small_lines(2)).get_json()["id"]
    input_bytes = quota(app).used()
    batch_id = post_batch(client, file_id).get_json()["id"]
    services(app).redis.pexpire(keys.batch(batch_id), 1000)  # the record ends in a second
    ingest_batch(app, batch_id)
    assert quota(app).used() > input_bytes + 2 * 1000
    time.sleep(1.2)
    assert quota(app).used() == input_bytes
    # The next hold's script drops it for good; an upload finds the room back.
    assert upload(client, b"x" * (QUOTA - input_bytes - 1024), "user_data").status_code == 200
    assert held(app, batch_id) is None


def test_two_batches_of_one_key_read_at_once_never_pass_the_quota(
    app: Flask, client: FlaskClient
) -> None:
    ids = []
    for tag in ("a", "b"):
        file_id = upload(client, small_lines(6, tag)).get_json()["id"]
        ids.append(post_batch(client, file_id).get_json()["id"])
    used: list[int] = []
    reading = True

    def watch() -> None:
        while reading:
            used.append(quota(app).used())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _turn in range(12):
            readers = [threading.Thread(target=ingest_batch, args=(app, i)) for i in ids]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join()
            used.append(quota(app).used())
            ready = [job for i in ids for job in job_ids_of(app, i)
                     if services(app).store.status(job) is JobStatus.QUEUED]  # fmt: skip
            run_jobs(app, ready)
            for batch_id in ids:
                sweep_now(app, batch_id)
            states = [
                client.get(f"/v1/batches/{i}", headers=bearer(FIRST)).get_json()["status"]
                for i in ids
            ]
            if states == ["completed", "completed"]:
                break
    finally:
        reading = False
        watcher.join()
    assert states == ["completed", "completed"], states
    assert max(used) <= QUOTA, max(used)
    totals: list[Any] = [
        client.get(f"/v1/batches/{i}", headers=bearer(FIRST)).get_json()["request_counts"]
        for i in ids
    ]
    assert totals == [{"total": 6, "completed": 6, "failed": 0}] * 2, totals


def test_a_batch_whose_error_lines_alone_do_not_fit_is_refused_naming_its_input(
    app: Flask, client: FlaskClient
) -> None:
    """Every line's unread error line is held when the batch is made: a batch whose error
    lines could pass the key's storage is a 429 naming the field, holding nothing after;
    one that fits is made, holding them."""
    many = small_lines(40)  # 40 error lines of about 800 bytes: past QUOTA
    file_id = upload(client, many).get_json()["id"]
    before = quota(app).used()
    listed = client.get("/v1/batches?limit=100", headers=bearer(FIRST)).get_json()["data"]
    for refused, param in (
        (post_batch(client, file_id), "input_file_id"),
        (client.post("/v1/batches", data=many, headers=bearer(FIRST)), "input"),
    ):
        assert refused.status_code == 429, refused.get_data(as_text=True)
        error = refused.get_json()["error"]
        assert (error["code"], error["param"]) == ("file_storage_full", param), error
        assert "40 lines' error lines" in error["message"], error
        assert f"files.max_bytes_per_key is {QUOTA}" in error["message"], error
        assert quota(app).used() == before  # nothing held, no input file left behind
    assert client.get("/v1/batches?limit=100", headers=bearer(FIRST)).get_json()["data"] == listed
    made = post_batch(client, upload(client, small_lines(4)).get_json()["id"]).get_json()
    assert made["status"] == "validating"
    assert (held(app, made["id"]) or 0) > 4 * 700 + files_overhead(made["id"])


def test_a_hold_given_back_in_part_never_goes_below_zero(app: Flask, client: FlaskClient) -> None:
    """Settle passes and a finalize give back a batch's hold in parts: past what it holds, the
    script stops at zero, so no batch can lower what another holder counts."""
    room = quota(app)
    room.hold("other", 5_000, time.time() + 60)
    room.hold("batch_x_output", 3_000, time.time() + 60)
    room.hold("batch_x_output", -2_000, time.time() + 60, enforce=False)
    assert room.used() == 6_000
    room.hold("batch_x_output", -9_000, time.time() + 60, enforce=False)
    assert room.used() == 5_000
    with pytest.raises(QuotaFull):
        room.hold("batch_x_output", QUOTA - 5_000 + 1, time.time() + 60)
    # From an empty or absent hold (a batch read before holds existed, a lapsed one): nothing
    # to give back, and no error (Lua's -0 would be "-0", which HINCRBY refuses).
    room.hold("batch_x_output", -3_000, time.time() + 60, enforce=False)
    room.hold("batch_x_output", -10, time.time() + 60, enforce=False)
    room.hold("batch_absent_output", -10, time.time() + 60, enforce=False)
    assert room.used() == 5_000


def test_a_batch_without_a_hold_still_completes(app: Flask, client: FlaskClient) -> None:
    """A batch read before output holds existed (no holder at all) settles and finalizes."""
    file_id = upload(client, small_lines(2)).get_json()["id"]
    batch = create(client, file_id).get_json()
    redis_client = services(app).redis
    redis_client.hdel(keys.files_held_bytes(DIGEST), holder_of(batch["id"]))
    redis_client.zrem(keys.files_held(DIGEST), holder_of(batch["id"]))
    run_jobs(app, [job for item in items(app, batch["id"]) for job in item.job_ids])
    assert settle(client, batch["id"]).get_json()["status"] == "completed"


WORST_BODIES = {
    "/v1/chat/completions": line("w", n=2, max_tokens=6, logprobs=True, top_logprobs=5),
    "/v1/completions": line("w", "/v1/completions", n=2, max_tokens=6, logprobs=5),
    # logprobs 0 still renders a logprobs entry a token (its bound once missed it).
    "/v1/completions logprobs 0": line("w", "/v1/completions", n=2, max_tokens=6, logprobs=0),
    "/v1/responses": {"body": {
        "model": "bound", "input": "hi", "instructions": "Be brief.\n\t\u0001",
        "max_output_tokens": 6, "top_logprobs": 5,
        "include": ["message.output_text.logprobs"], "metadata": {"k": "v"},
    }},
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(WORST_BODIES))
def test_a_lines_bound_holds_its_worst_output(app: Flask, case: str) -> None:
    """Every token the longest the vocabulary has, as text, as its logprobs entry and as each
    alternative: the line as the output file writes it still fits ``line_bound``."""
    svc = services(app)
    url = case.split()[0]
    item = BatchItem("worst", url, WORST_BODIES[case]["body"])
    with app.test_request_context("/v1/batches"):
        jobs = jobs_for_item(svc, item, 60)
    item.job_ids = [job.id for job in jobs]
    spelled = svc.tokenizer(jobs[0].model).token_bytes()
    text = max((x.decode("utf-8", "replace") for x in spelled), key=_json_weight)
    alternatives = sorted((alternative_text(x) for x in spelled), key=_json_weight)[-5:]
    lp = -1.2345678901234567e-05
    tokens: dict[str, list[TokenEvent]] = {}
    for job in jobs:
        tokens[job.id] = [
            TokenEvent(job.id, i, text, lp, tuple((alt, lp) for alt in alternatives))
            for i in range(job.params.max_tokens)
        ]
        job.status, job.output = JobStatus.SUCCEEDED, text * job.params.max_tokens
        job.finish_reason, job.usage = FinishReason.LENGTH, Usage(3, job.params.max_tokens)
    batch = BatchRecord("batch_" + "0" * 32, DIGEST, time.time(), url, 1)
    store = svc.store
    original = store.tokens
    try:
        store.tokens = tokens.__getitem__  # type: ignore[method-assign]
        written = encoded_line(output_line(svc, batch, 0, item, "completed", jobs))
    finally:
        store.tokens = original  # type: ignore[method-assign]
    assert json.loads(written)["error"] is None
    assert len(written) <= line_bound(svc, item, jobs), (len(written), line_bound(svc, item, jobs))


def _json_weight(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode()) + len(json.dumps(list(text.encode())))
