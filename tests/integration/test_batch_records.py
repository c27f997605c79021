"""How a JSONL batch's records are written: its jobs a group per transaction, then the batch
(with an ``Idempotency-Key``, in the key's script); a failure in between takes the jobs back.
In process, on the test Redis; ``late`` has no worker, so nothing runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from flask import Flask

from trickle import keys
from trickle.config.settings import Settings
from web.batches import routes as batches
from web.services import services


def body(lines: int) -> bytes:
    request = {"model": "late", "prompt": "Hi", "max_tokens": 1}
    return "".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                    "body": request}) + "\n"
        for i in range(lines)
    ).encode()  # fmt: skip


def test_a_redis_error_after_some_groups_takes_their_jobs_back(
    settings: Settings,
    make_app: Callable[[Settings], Flask],
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = make_app(settings)
    store = services(app).store
    recorded: list[str] = []
    create_many = store.create_many

    def spying(jobs: Any, also: Any = None) -> None:
        group = list(jobs)
        create_many(group, also)
        recorded.extend(job.id for job in group)

    def down(*_args: Any, **_kwargs: Any) -> None:
        raise redis.ConnectionError("Redis went away")

    monkeypatch.setattr(store, "create_many", spying)
    monkeypatch.setattr(store, "create_once", down)
    lines = 2 * batches.RECORD_GROUP + 7  # three groups
    response = app.test_client().post(
        "/v1/batches", data=body(lines), headers={"Idempotency-Key": "records-take-back"}
    )
    assert response.status_code == 503, response.get_json()
    assert len(recorded) == lines  # every group was written before the key's script failed
    pipe = redis_client.pipeline(transaction=False)
    for job_id in recorded:
        pipe.exists(keys.job(job_id))
    assert sum(pipe.execute()) == 0  # and every one was taken back
    queued = redis_client.zrange(keys.queued_jobs(keys.shard_of(recorded[0])), 0, -1)
    assert recorded[0] not in queued
