"""A named key's ``max_queued_jobs`` makes a file batch's lines wait, never fail, and never
overshoot the cap (audit hole 9).

The probe: with a slow drain, 1,041 of 2,000 lines failed ``key_queue_full`` and the key's
waiting jobs reached 404 against a cap of 300. Here no worker serves ``bound``; the test drains
the key's queue itself, as workers taking jobs would, and runs the batch consumer's tasks itself:
the reading resumes on the sweep's turn, never on a read."""

from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from flask import Flask

from tests.file_batches import bearer, job_ids_of, jsonl, line, sweep_now
from trickle import keys
from trickle.config.settings import Settings
from trickle.jobs import BATCH_PRIORITY
from trickle.tenants import build_keys, digest_of_entry
from web.batches.tasks import ingest_batch
from web.services import services

KEY, NAME, CAP, LINES = "queue-cap-key", "capped", 5, 12


@pytest.fixture
def app(
    settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> Iterator[Flask]:
    bound = dataclasses.replace(settings.models["late"], name="bound")
    named = build_keys({NAME: {"key": KEY, "max_queued_jobs": CAP}})
    tenant_digest = digest_of_entry(KEY)
    redis_client.delete(keys.files_held(tenant_digest), keys.files_held_bytes(tenant_digest))
    app = make_app(
        dataclasses.replace(settings, keys=named, models={**settings.models, "bound": bound})
    )
    drain(app)
    yield app
    drain(app)


def waiting(app: Flask) -> int:
    return services(app).queues.depth("bound", NAME, BATCH_PRIORITY)


def drain(app: Flask) -> None:
    """Take every waiting job off the key's queue, as its workers would."""
    celery = services(app).celery
    with celery.connection_for_write() as conn:
        conn.default_channel.queue_purge(keys.tenant_queue("bound", NAME))


def settled_at(app: Flask, count: int) -> int:
    """The key's waiting jobs once the fan-out has sent what it was given (at most 5 s)."""
    deadline = time.monotonic() + 5
    while waiting(app) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # a fan-out sending more than it should would show now
    return waiting(app)


def test_lines_past_the_keys_cap_wait_and_never_overshoot_it(app: Flask) -> None:
    client = app.test_client()
    data = jsonl(*(line(f"c{i}") for i in range(LINES)))
    form = {"purpose": "batch", "file": (io.BytesIO(data), "in.jsonl")}
    file_id = client.post("/v1/files", data=form, headers=bearer(KEY)).get_json()["id"]
    request = {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
               "completion_window": "24h"}  # fmt: skip
    created = client.post("/v1/batches", json=request, headers=bearer(KEY))
    assert created.status_code == 200, created.get_data(as_text=True)
    batch = created.get_json()
    assert batch["status"] == "validating" and job_ids_of(app, batch["id"]) == []
    ingest_batch(app, batch["id"])  # the batch consumer's task: the rest waits for room
    path = f"/v1/batches/{batch['id']}"
    found = client.get(path, headers=bearer(KEY)).get_json()
    assert found["status"] == "validating" and found["request_counts"]["failed"] == 0
    assert len(job_ids_of(app, batch["id"])) == CAP
    assert settled_at(app, CAP) == CAP

    drain(app)  # the workers took the first five: a read changes nothing, a sweep reads on
    client.get(path, headers=bearer(KEY))
    assert len(job_ids_of(app, batch["id"])) == CAP
    assert sweep_now(app, batch["id"]) == [keys.BATCH_INGEST_TASK]
    assert len(job_ids_of(app, batch["id"])) == 2 * CAP
    assert settled_at(app, CAP) == CAP

    drain(app)
    sweep_now(app, batch["id"])
    assert settled_at(app, LINES - 2 * CAP) == LINES - 2 * CAP
    done = client.get(path, headers=bearer(KEY)).get_json()
    assert done["status"] == "in_progress"
    assert done["request_counts"] == {"total": LINES, "completed": 0, "failed": 0}
    assert len(set(job_ids_of(app, batch["id"]))) == LINES
