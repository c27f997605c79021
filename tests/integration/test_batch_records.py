"""How a JSONL-body batch is recorded: its body stored as its input file, then the batch (with
an ``Idempotency-Key``, in the key's script); a failure in between takes the file and the
batch's storage hold back. In process, on the test Redis; ``late`` has no worker."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from flask import Flask

from trickle import keys
from trickle.config.settings import Settings
from web.batches.quota import batch_inputs
from web.services import services


def body(lines: int) -> bytes:
    request = {"model": "late", "prompt": "Hi", "max_tokens": 1}
    return "".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                    "body": request}) + "\n"
        for i in range(lines)
    ).encode()  # fmt: skip


def test_a_redis_error_recording_the_batch_takes_its_input_back(
    settings: Settings,
    make_app: Callable[[Settings], Flask],
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = make_app(settings)
    svc = services(app)

    def down(*_args: Any, **_kwargs: Any) -> None:
        raise redis.ConnectionError("Redis went away")

    monkeypatch.setattr(svc.store, "create_once", down)
    anonymous = ""  # no API keys: every caller's digest
    files_before = set(redis_client.zrange(keys.files_of(anonymous), 0, -1))
    held_before = batch_inputs(svc, anonymous).used()
    response = app.test_client().post(
        "/v1/batches", data=body(7), headers={"Idempotency-Key": "records-take-back"}
    )
    assert response.status_code == 503, response.get_json()
    # The stored input went again, and so did the batch's hold on the key's storage.
    assert set(redis_client.zrange(keys.files_of(anonymous), 0, -1)) == files_before
    assert batch_inputs(svc, anonymous).used() == held_before
    assert not redis_client.exists(keys.idempotency(anonymous, "records-take-back"))
