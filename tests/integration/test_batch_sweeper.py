"""The web tier's batch sweeper on the test Redis: a batch whose requests all finished gets its
files and final stage with nobody reading it, one past its window expires, and one process
sweeps per turn. No worker serves ``bound``: the test runs the jobs as a worker would."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import redis
from flask import Flask

from tests.faultstack import wait_for
from tests.file_batches import (
    FIRST,
    bearer,
    content,
    create,
    job_ids_of,
    jsonl,
    line,
    run_jobs,
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
    redis_client.delete(keys.batches_unsettled(), keys.batch_sweep())
    app = make_app(with_files(file_settings, batch_sweep_seconds=0.2))
    try:
        swept_alone(app, redis_client)
    finally:
        for stop in services(app).on_close:  # the app lives on: its sweeper must not
            stop()
    purge(app)


def swept_alone(app: Flask, redis_client: redis.Redis) -> None:
    client = app.test_client()
    file_id = upload(client, jsonl(line("a"), line("b"), "{bad")).get_json()["id"]
    batch_id = create(client, file_id).get_json()["id"]
    assert redis_client.zscore(keys.batches_unsettled(), batch_id) is not None
    run_jobs(app, job_ids_of(app, batch_id))
    wait_for(lambda: stage(redis_client, batch_id) == "completed", 10, "the sweeper")
    assert redis_client.zscore(keys.batches_unsettled(), batch_id) is None
    done = client.get(f"/v1/batches/{batch_id}", headers=bearer(FIRST)).get_json()
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert [x["custom_id"] for x in content(client, done["output_file_id"])] == ["a", "b"]
    assert len(content(client, done["error_file_id"])) == 1


def test_one_process_sweeps_a_turn_and_a_batch_past_its_window_expires(
    file_settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> None:
    # Only this test's batches are swept (the others' are left in the set by tests that read).
    redis_client.delete(keys.batches_unsettled(), keys.batch_sweep())
    settings = with_files(file_settings, batch_window_seconds=1, batch_sweep_seconds=0)
    app, other = make_app(settings), make_app(settings)
    client = app.test_client()
    file_id = upload(client, jsonl(line("a"), line("b"))).get_json()["id"]
    batch_id = create(client, file_id).get_json()["id"]
    first, second = job_ids_of(app, batch_id)
    run_jobs(app, [first])
    # Not due yet (a request is pending, the window is open): swept, but left as it is.
    assert sweep(services(app), 0.3) == 0 and stage(redis_client, batch_id) == "in_progress"
    assert redis_client.zscore(keys.batches_unsettled(), batch_id) is not None
    time.sleep(1.1)  # the window closes, the turn's lock lapses
    assert sweep(services(app), 30) == 1
    # That process holds the turn: another one's sweep does nothing until it lapses.
    assert sweep(services(other), 30) == 0
    assert stage(redis_client, batch_id) == "expired"
    found = client.get(f"/v1/batches/{batch_id}", headers=bearer(FIRST)).get_json()
    assert [x["custom_id"] for x in content(client, found["output_file_id"])] == ["a"]
    (error,) = content(client, found["error_file_id"])
    assert error["error"]["code"] == "batch_expired"
    job = services(app).store.get(second)
    assert job is not None and job.status is JobStatus.CANCELED
    redis_client.delete(keys.batch_sweep())
    purge(app)
