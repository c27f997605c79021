"""Exact bounds: the queue limit to the job, rate limits per key, and
another key's batch invisible. In-process apps on the test Redis (no worker serves "bound")."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from tests.faultstack import wait_for
from tests.file_batches import read_in
from tests.metrics_text import parse_samples
from trickle import keys
from trickle.config.sections import AuthSettings, LimitSettings, RateLimitSettings
from trickle.config.settings import Settings
from trickle.jobs import BATCH_PRIORITY
from trickle.queue import tenant_queues
from trickle.tenants import build_keys
from web.services import services

LIMIT = 6
FIRST, SECOND = "bound-key-one", "bound-key-two"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def bounded_settings(settings: Settings) -> Settings:
    """A model no worker serves, so whatever is queued for it stays queued."""
    limits = dataclasses.replace(settings.limits, max_queued_jobs=LIMIT)
    bound = dataclasses.replace(settings.models["late"], name="bound")
    return dataclasses.replace(
        settings,
        limits=limits,
        models={**settings.models, "bound": bound},
        auth=AuthSettings((FIRST, SECOND)),
    )


@pytest.fixture
def client(
    bounded_settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> Iterator[FlaskClient]:
    app = make_app(bounded_settings)

    def empty() -> None:
        celery = services(app).celery
        with celery.connection_for_write() as conn:
            # Each key's jobs wait on its own queue (every key is a tenant).
            for queue in tenant_queues(celery).of_model("bound"):
                celery.amqp.queues[queue].bind(conn.default_channel).purge()

    empty()
    yield app.test_client()
    empty()


def submit(client: FlaskClient, key: str = FIRST) -> int:
    body = {"prompt": "x", "model": "bound", "max_tokens": 1}
    return client.post("/v1/jobs", json=body, headers=bearer(key)).status_code


def batch_body(custom_id: str = "b-0") -> dict[str, object]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "bound", "prompt": "x", "max_tokens": 1},
    }


def create_batch(client: FlaskClient, key: str, count: int) -> dict[str, object]:
    lines = [batch_body(f"b-{i}") for i in range(count)]
    created = client.post(
        "/v1/batches",
        data="".join(json.dumps(line) + "\n" for line in lines),
        headers={**bearer(key), "Content-Type": "application/jsonl"},
    )
    read = read_in(client, created, bearer(key))  # the batch consumer's reading, here
    assert read.status_code == 200, read.get_data(as_text=True)
    return read.get_json()  # type: ignore[no-any-return]


def test_the_queue_takes_exactly_max_queued_jobs_then_429(client: FlaskClient) -> None:
    assert [submit(client) for _ in range(LIMIT)] == [202] * LIMIT
    refused = client.post("/v1/jobs", json={"prompt": "x", "model": "bound"}, headers=bearer(FIRST))
    assert refused.status_code == 429
    assert refused.get_json()["error"]["code"] == "queue_full"
    assert f"limits.max_queued_jobs = {LIMIT}" in refused.get_json()["error"]["message"]
    assert int(refused.headers["Retry-After"]) > 0


def test_batch_jobs_never_close_the_interactive_queue(
    client: FlaskClient, redis_client: redis.Redis
) -> None:
    # One key's batch, larger than the whole interactive bound, waits at a priority of its own.
    create_batch(client, FIRST, 3 * LIMIT)
    queues = services(client.application).queues
    # A batch's queue sends run in the background once it is accepted: wait for them all.
    wait_for(lambda: queues.depth("bound") == 3 * LIMIT, 10, "the batch's messages")
    # Another key still finds every interactive place free, and only those.
    assert [submit(client, SECOND) for _ in range(LIMIT)] == [202] * LIMIT
    body = {"prompt": "x", "model": "bound"}
    refused = client.post("/v1/jobs", json=body, headers=bearer(SECOND))
    assert refused.status_code == 429
    message = refused.get_json()["error"]["message"]
    # The refusal names the caller's limit, not the depth of everyone's work.
    assert f"limits.max_queued_jobs = {LIMIT}" in message
    assert str(4 * LIMIT) not in message and str(3 * LIMIT) not in message
    metrics = client.get("/metrics", headers=bearer(FIRST)).get_data(as_text=True)
    assert parse_samples(metrics)['trickle_queue_depth{model="bound"}'] == 4 * LIMIT


def test_the_batch_backlog_is_per_key(
    bounded_settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    suffix = uuid.uuid4().hex[:8]  # names of its own: their queues start empty
    first, second = f"batch-a-{suffix}", f"batch-b-{suffix}"
    tables = {first: {"key": f"key-{first}"}, second: {"key": f"key-{second}"}}
    app = make_app(
        dataclasses.replace(
            bounded_settings,
            keys=build_keys(tables),
            limits=dataclasses.replace(bounded_settings.limits, max_batch_backlog=3),
        )
    )
    client = app.test_client()
    queues = services(app).queues
    create_batch(client, f"key-{first}", 3)
    wait_for(lambda: queues.depth("bound", first, BATCH_PRIORITY) == 3, 10, "the batch's messages")
    refused = client.post(
        "/v1/batches",
        data=json.dumps(batch_body()) + "\n",
        headers={**bearer(f"key-{first}"), "Content-Type": "application/jsonl"},
    )
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
    error = refused.get_json()["error"]
    assert error["code"] == "batch_queue_full"
    assert "limits.max_batch_backlog = 3" in error["message"]
    # The other key's batches and every key's interactive work still get in.
    create_batch(client, f"key-{second}", 3)
    assert submit(client, f"key-{first}") == 202
    assert submit(client, f"key-{second}") == 202


def test_a_request_for_several_jobs_needs_room_for_all(client: FlaskClient) -> None:
    assert [submit(client) for _ in range(LIMIT - 1)] == [202] * (LIMIT - 1)
    body = {"model": "bound", "prompt": "x", "max_tokens": 1, "n": 2}
    response = client.post("/v1/completions", json=body, headers=bearer(FIRST))
    assert response.status_code == 429
    assert submit(client) == 202  # the one place left is still there


def test_another_keys_batch_answers_404(client: FlaskClient) -> None:
    batch = create_batch(client, FIRST, 1)
    path = f"/v1/batches/{batch['id']}"
    assert client.get(path, headers=bearer(FIRST)).status_code == 200
    for response in (
        client.get(path, headers=bearer(SECOND)),
        client.get(f"{path}/output", headers=bearer(SECOND)),
        client.post(f"{path}/cancel", headers=bearer(SECOND)),
    ):
        assert response.status_code == 404
        assert response.get_json()["error"]["param"] == "batch_id"
    # The tenant's batch was not canceled by the other key's attempt.
    assert client.get(path, headers=bearer(FIRST)).get_json()["status"] != "cancelled"


@pytest.fixture
def limited(
    bounded_settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> FlaskClient:
    limits = RateLimitSettings(requests_per_minute=2, tokens_per_minute=0)
    app = make_app(
        dataclasses.replace(
            bounded_settings,
            rate_limits=limits,
            limits=dataclasses.replace(bounded_settings.limits, max_queued_jobs=1000),
        )
    )
    for key in redis_client.scan_iter(match=f"{keys.RATE_LIMIT_PREFIX}*"):  # fresh windows
        redis_client.delete(key)
    return app.test_client()


def post(client: FlaskClient, key: str, address: str = "10.0.0.7") -> int:
    return client.post(
        "/v1/jobs",
        json={"prompt": "x", "model": "demo", "max_tokens": 1},
        headers=bearer(key),
        environ_base={"REMOTE_ADDR": address},
    ).status_code


def test_two_keys_from_one_address_have_separate_limits(limited: FlaskClient) -> None:
    assert [post(limited, FIRST) for _ in range(3)] == [202, 202, 429]
    assert [post(limited, SECOND) for _ in range(3)] == [202, 202, 429]


def test_without_keys_each_address_has_its_own_limit(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    limits = RateLimitSettings(requests_per_minute=1, tokens_per_minute=0)
    app = make_app(dataclasses.replace(settings, rate_limits=limits, limits=LimitSettings()))
    client = app.test_client()
    first, second = f"10.1.{uuid.uuid4().int % 250}.1", f"10.2.{uuid.uuid4().int % 250}.2"

    def anonymous(address: str) -> int:
        return client.post(
            "/v1/jobs",
            json={"prompt": "x", "max_tokens": 1},
            environ_base={"REMOTE_ADDR": address},
        ).status_code

    assert [anonymous(first), anonymous(first), anonymous(second)] == [202, 429, 202]


def test_counters_live_under_the_key_schemas_prefix(
    limited: FlaskClient, redis_client: redis.Redis
) -> None:
    """Flask-Limiter's counters, under keys.RATE_LIMIT_PREFIX, kept one window (60 s)."""
    assert post(limited, FIRST) == 202
    found = sorted(redis_client.scan_iter(match=f"{keys.RATE_LIMIT_PREFIX}*"))
    assert len(found) == 1, found
    assert redis_client.get(found[0]) == "1"
    assert 0 < redis_client.ttl(found[0]) <= 60
    post(limited, FIRST)
    refused = limited.post(
        "/v1/jobs", json={"prompt": "x", "model": "demo", "max_tokens": 1}, headers=bearer(FIRST)
    )
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert "2 requests per minute" in refused.get_json()["error"]["message"]
