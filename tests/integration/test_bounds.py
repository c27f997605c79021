"""Exact bounds: the queue limit to the job, rate limits per key on an injected clock, and
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
from tests.metrics_text import parse_samples
from web.ratelimit import WINDOW_SECONDS, RateLimiter
from web.services import services
from worker import keys
from worker.config import AuthSettings, LimitSettings, RateLimitSettings, Settings

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
        queue = keys.model_queue("bound")
        celery = services(app).celery
        with celery.connection_for_write() as conn:
            celery.amqp.queues[queue].bind(conn.default_channel).purge()

    empty()
    yield app.test_client()
    empty()


def submit(client: FlaskClient, key: str = FIRST) -> int:
    body = {"prompt": "x", "model": "bound", "max_tokens": 1}
    return client.post("/v1/jobs", json=body, headers=bearer(key)).status_code


def create_batch(client: FlaskClient, key: str, count: int) -> dict[str, object]:
    lines = [
        {
            "custom_id": f"b-{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "bound", "prompt": "x", "max_tokens": 1},
        }
        for i in range(count)
    ]
    created = client.post(
        "/v1/batches",
        data="".join(json.dumps(line) + "\n" for line in lines),
        headers={**bearer(key), "Content-Type": "application/jsonl"},
    )
    assert created.status_code == 200, created.get_data(as_text=True)
    return created.get_json()  # type: ignore[no-any-return]


def test_the_queue_takes_exactly_max_queued_jobs_then_429(client: FlaskClient) -> None:
    assert [submit(client) for _ in range(LIMIT)] == [202] * LIMIT
    refused = client.post("/v1/jobs", json={"prompt": "x", "model": "bound"}, headers=bearer(FIRST))
    assert refused.status_code == 429
    assert refused.get_json()["error"]["code"] == "queue_full"
    assert f"{LIMIT} jobs waiting (limit {LIMIT})" in refused.get_json()["error"]["message"]
    assert int(refused.headers["Retry-After"]) > 0


def test_batch_priority_jobs_count_against_the_bound(
    client: FlaskClient, redis_client: redis.Redis
) -> None:
    # Batch-priority messages wait at a priority of their own: they still count.
    create_batch(client, FIRST, 2)
    queues = services(client.application).queues
    # A batch's queue sends run in the background once it is accepted: wait for both.
    wait_for(lambda: queues.depth("bound") == 2, 10, "the batch's two messages")
    assert [submit(client) for _ in range(LIMIT - 2)] == [202] * (LIMIT - 2)
    assert queues.depth("bound") == LIMIT
    assert submit(client) == 429
    metrics = client.get("/metrics", headers=bearer(FIRST)).get_data(as_text=True)
    assert parse_samples(metrics)['trickle_queue_depth{model="bound"}'] == LIMIT


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
    # The owner's batch was not canceled by the other key's attempt.
    assert client.get(path, headers=bearer(FIRST)).get_json()["status"] != "cancelled"


class Clock:
    """A settable clock at the start of a window no other test uses."""

    def __init__(self) -> None:
        self.now = float(uuid.uuid4().int % 10**6 * WINDOW_SECONDS)

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def limited(
    bounded_settings: Settings, make_app: Callable[[Settings], Flask]
) -> tuple[FlaskClient, Clock]:
    limits = RateLimitSettings(requests_per_minute=2, tokens_per_minute=0)
    app = make_app(
        dataclasses.replace(
            bounded_settings,
            rate_limits=limits,
            limits=dataclasses.replace(bounded_settings.limits, max_queued_jobs=1000),
        )
    )
    clock = Clock()
    svc = services(app)
    svc.rate_limiter = RateLimiter(svc.redis, limits, clock=clock)
    return app.test_client(), clock


def post(client: FlaskClient, key: str, address: str = "10.0.0.7") -> int:
    return client.post(
        "/v1/jobs",
        json={"prompt": "x", "model": "demo", "max_tokens": 1},
        headers=bearer(key),
        environ_base={"REMOTE_ADDR": address},
    ).status_code


def test_two_keys_from_one_address_have_separate_limits(
    limited: tuple[FlaskClient, Clock],
) -> None:
    client, _clock = limited
    assert [post(client, FIRST) for _ in range(3)] == [202, 202, 429]
    assert [post(client, SECOND) for _ in range(3)] == [202, 202, 429]


def test_the_window_is_the_clocks_minute(limited: tuple[FlaskClient, Clock]) -> None:
    client, clock = limited
    clock.now += 50  # ten seconds before the window ends
    assert [post(client, FIRST) for _ in range(3)] == [202, 202, 429]
    refused = client.post(
        "/v1/jobs", json={"prompt": "x", "model": "demo", "max_tokens": 1}, headers=bearer(FIRST)
    )
    assert refused.headers["Retry-After"] == "11"  # to the next window, rounded up
    clock.now += 10  # the next minute: a fresh window
    assert [post(client, FIRST) for _ in range(3)] == [202, 202, 429]


def test_without_keys_each_address_has_its_own_limit(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    limits = RateLimitSettings(requests_per_minute=1, tokens_per_minute=0)
    app = make_app(dataclasses.replace(settings, rate_limits=limits, limits=LimitSettings()))
    svc = services(app)
    svc.rate_limiter = RateLimiter(svc.redis, limits, clock=Clock())
    client = app.test_client()

    def anonymous(address: str) -> int:
        return client.post(
            "/v1/jobs",
            json={"prompt": "x", "max_tokens": 1},
            environ_base={"REMOTE_ADDR": address},
        ).status_code

    assert [anonymous("10.1.1.1"), anonymous("10.1.1.1"), anonymous("10.1.1.2")] == [
        202,
        429,
        202,
    ]


def test_counters_follow_the_key_schema(
    limited: tuple[FlaskClient, Clock], redis_client: redis.Redis
) -> None:
    """trickle:rate:{<subject>:<minute>}:<requests|tokens>, kept two windows (README, keys.py);
    the two counters share a hash tag, so their script stays on one Redis Cluster slot."""
    client, clock = limited
    window = int(clock.now // WINDOW_SECONDS)
    clock.now += 59.5  # the last half second of the window
    assert post(client, FIRST) == 202
    found = sorted(redis_client.scan_iter(match=f"trickle:rate:{{*:{window}}}:*"))
    assert len(found) == 2, found
    requests_key, tokens_key = found
    assert requests_key.endswith(f":{window}}}:requests") and tokens_key.endswith(
        f":{window}}}:tokens"
    )
    assert requests_key.rsplit(":", 1)[0] == tokens_key.rsplit(":", 1)[0]
    assert redis_client.get(requests_key) == "1"
    assert redis_client.get(tokens_key) == "3"  # prompt "x" with its start token + max_tokens 1
    assert 60 < redis_client.ttl(requests_key) <= 2 * WINDOW_SECONDS
    post(client, FIRST)
    refused = client.post(
        "/v1/jobs", json={"prompt": "x", "model": "demo", "max_tokens": 1}, headers=bearer(FIRST)
    )
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1"  # half a second left, rounded up
    assert "2 requests per minute" in refused.get_json()["error"]["message"]
