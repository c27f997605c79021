"""The batch sweep on the test Redis: it sends a finished batch's settle task, which writes its
files and final stage with nobody reading it, expires one past its window, resumes a reading
nobody holds, and gives each turn to one batch consumer. No worker serves ``bound``: the test
runs the jobs as a worker would, and the sent tasks as the batch consumer would."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import redis
from flask import Flask

from tests.file_batches import (
    FIRST,
    bearer,
    content,
    create,
    job_ids_of,
    jsonl,
    line,
    run_jobs,
    sweep_now,
    upload,
)
from tests.integration.test_files_batches import file_settings, purge
from trickle import keys
from trickle.config.settings import Settings
from trickle.jobs import JobStatus
from web.batches.sweeper import sweep
from web.services import services

__all__ = ["file_settings"]  # the module's fixture, shared


def with_files(settings: Settings, **files: float) -> Settings:
    return dataclasses.replace(settings, files=dataclasses.replace(settings.files, **files))


def stage(redis_client: redis.Redis, batch_id: str) -> str | None:
    value = redis_client.hget(keys.batch(batch_id), "stage")
    return None if value is None else str(value)


def test_a_finished_batch_gets_its_files_with_nobody_reading_it(
    file_settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> None:
    app = make_app(file_settings)
    client = app.test_client()
    file_id = upload(client, jsonl(line("a"), line("b"), "{bad")).get_json()["id"]
    batch_id = create(client, file_id).get_json()["id"]
    assert redis_client.zscore(keys.batches_unsettled(), batch_id) is not None
    assert sweep_now(app, batch_id) == [keys.BATCH_SETTLE_TASK]  # not due: left as it is
    assert stage(redis_client, batch_id) == "in_progress"
    run_jobs(app, job_ids_of(app, batch_id))
    assert sweep_now(app, batch_id) == [keys.BATCH_SETTLE_TASK]
    assert stage(redis_client, batch_id) == "completed"
    assert redis_client.zscore(keys.batches_unsettled(), batch_id) is None
    assert sweep_now(app, batch_id) == []  # settled: the sweep leaves it
    done = client.get(f"/v1/batches/{batch_id}", headers=bearer(FIRST)).get_json()
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert [x["custom_id"] for x in content(client, done["output_file_id"])] == ["a", "b"]
    assert len(content(client, done["error_file_id"])) == 1
    purge(app)


def test_one_consumer_sweeps_a_turn_and_a_batch_past_its_window_expires(
    file_settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> None:
    app = make_app(with_files(file_settings, batch_window_seconds=1))
    client = app.test_client()
    file_id = upload(client, jsonl(line("a"), line("b"))).get_json()["id"]
    batch_id = create(client, file_id).get_json()["id"]
    first, second = job_ids_of(app, batch_id)
    run_jobs(app, [first])
    time.sleep(1.1)  # the window closes
    redis_client.delete(keys.batch_sweep())
    sent: list[tuple[str, str]] = []
    assert sweep(services(app), 30, lambda task, found: sent.append((task, found))) >= 1
    assert (keys.BATCH_SETTLE_TASK, batch_id) in sent
    # That consumer holds the turn: another one's sweep sends nothing until it lapses.
    assert sweep(services(app), 30, lambda task, found: sent.append((task, found))) == 0
    assert sweep_now(app, batch_id) == [keys.BATCH_SETTLE_TASK]
    assert stage(redis_client, batch_id) == "expired"
    found = client.get(f"/v1/batches/{batch_id}", headers=bearer(FIRST)).get_json()
    assert [x["custom_id"] for x in content(client, found["output_file_id"])] == ["a"]
    (error,) = content(client, found["error_file_id"])
    assert error["error"]["code"] == "batch_expired"
    job = services(app).store.get(second)
    assert job is not None and job.status is JobStatus.CANCELED
    redis_client.delete(keys.batch_sweep())
    purge(app)
