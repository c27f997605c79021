"""Batch storage per key (``limits.max_batch_input_bytes_per_key``): the input a key's live
batches hold counts against its own bound, JSONL bodies and input files alike; a batch past it
is a 429 naming the input, which tells the caller its own figures only. In process, on the test
Redis; no worker serves ``bound``, so the batches' jobs just wait."""

from __future__ import annotations

import dataclasses
import io
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from trickle import keys
from trickle.config.sections import AuthSettings
from trickle.config.settings import Settings
from trickle.tenants import digest_of_entry
from web.services import services

FIRST, SECOND = "quota-key-one", "quota-key-two"
QUOTA = 20_000


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def body(lines: int, tag: str) -> bytes:
    """JSONL of ``lines`` one-token completions for the unserved model, about 150 bytes each."""
    request = {"model": "bound", "prompt": "The", "max_tokens": 1}
    return "".join(
        json.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/completions",
                    "body": request}) + "\n"
        for i in range(lines)
    ).encode()  # fmt: skip


@pytest.fixture
def client(
    settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> Iterator[FlaskClient]:
    bound = dataclasses.replace(settings.models["late"], name="bound")
    limits = dataclasses.replace(settings.limits, max_batch_input_bytes_per_key=QUOTA)
    app = make_app(
        dataclasses.replace(
            settings,
            limits=limits,
            models={**settings.models, "bound": bound},
            auth=AuthSettings((FIRST, SECOND)),
        )
    )
    for key in (FIRST, SECOND):  # each test starts with no batch of either key
        tenant_digest = digest_of_entry(key)
        redis_client.delete(
            keys.batches_of(tenant_digest),
            keys.batch_inputs_held(tenant_digest),
            keys.batch_inputs_held_bytes(tenant_digest),
        )
    yield app.test_client()
    celery = services(app).celery
    with celery.connection_for_write() as conn:
        celery.amqp.queues[keys.model_queue("bound")].bind(conn.default_channel).purge()


def post(client: FlaskClient, data: bytes, key: str) -> Any:
    return client.post("/v1/batches", data=data, headers=bearer(key))


def test_a_keys_live_batches_bound_its_next_one_and_no_other_keys(
    client: FlaskClient, redis_client: redis.Redis
) -> None:
    first = body(80, "a")  # about 12 KB
    assert 10_000 < len(first) < QUOTA < 2 * len(first)
    created = post(client, first, FIRST)
    assert created.status_code == 200, created.get_json()
    refused = post(client, body(80, "b"), FIRST)
    assert refused.status_code == 429
    error = refused.get_json()["error"]
    assert (error["code"], error["param"]) == ("batch_storage_full", "input")
    assert f"hold {len(first)}" in error["message"] and str(QUOTA) in error["message"]
    assert "max_batch_input_bytes_per_key" in error["message"]
    assert int(refused.headers["Retry-After"]) > 0
    # Another key has its own room, and its refusal tells its own figures, never the first's.
    other = body(79, "c")
    assert len(other) != len(first) and 2 * len(other) > QUOTA
    assert post(client, other, SECOND).status_code == 200
    again = post(client, other, SECOND).get_json()["error"]
    assert f"hold {len(other)}" in again["message"] and str(len(first)) not in again["message"]
    # Once the first key's batch has expired (its record gone), its room is back.
    batch_id = created.get_json()["id"]
    redis_client.delete(keys.batch(batch_id))
    redis_client.zadd(keys.batch_inputs_held(digest_of_entry(FIRST)), {batch_id: 1})  # lapsed
    assert post(client, body(80, "d"), FIRST).status_code == 200


def test_a_file_batch_counts_its_input_file(client: FlaskClient) -> None:
    first = body(80, "f")
    form = {"purpose": "batch", "file": (io.BytesIO(first), "input.jsonl")}
    uploaded = client.post("/v1/files", data=form, headers=bearer(FIRST)).get_json()
    request = {"input_file_id": uploaded["id"], "endpoint": "/v1/completions",
               "completion_window": "24h"}  # fmt: skip
    made = client.post("/v1/batches", json=request, headers=bearer(FIRST))
    assert made.status_code == 200, made.get_json()
    assert made.get_json()["status"] == "validating"  # held at once, read by the batch task
    # The same file again, or a JSONL body, would take the key past its bound.
    refused = client.post("/v1/batches", json=request, headers=bearer(FIRST))
    assert refused.status_code == 429
    assert refused.get_json()["error"]["param"] == "input_file_id"
    assert post(client, body(80, "g"), FIRST).get_json()["error"]["param"] == "input"


def test_concurrent_batches_never_pass_the_bound(client: FlaskClient) -> None:
    """Four batches at once, room for one: the hold is taken in one script, so exactly one
    is made (the input read once, then written, let all four through)."""
    app = client.application
    start = threading.Barrier(4)
    statuses: list[int] = []

    def send(tag: str) -> None:
        mine = app.test_client()
        start.wait()
        statuses.append(post(mine, body(80, tag), FIRST).status_code)

    threads = [threading.Thread(target=send, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200, 429, 429, 429], statuses
