"""API keys: with keys configured, /v1 wants a valid bearer token; health routes stay open."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient

from web.ratelimit import WINDOW_SECONDS, RateLimiter
from web.services import services
from worker.config import AuthSettings, RateLimitSettings, Settings, load_settings

DIGESTED = "second-key"


@pytest.fixture(scope="module")
def client(settings: Settings, make_app: Callable[[Settings], Flask]) -> FlaskClient:
    digest = hashlib.sha256(DIGESTED.encode()).hexdigest()
    keyed = dataclasses.replace(settings, auth=AuthSettings(("first-key", f"sha256:{digest}")))
    return make_app(keyed).test_client()


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic Zmlyc3Qta2V5", "Bearer "])
def test_missing_or_wrong_key_is_401(client: FlaskClient, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    for response in (
        client.post("/v1/jobs", json={"prompt": "hi"}, headers=headers),
        client.get("/v1/models", headers=headers),
        client.post("/v1/chat/completions", json={}, headers=headers),
    ):
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert response.get_json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("key", ["first-key", DIGESTED])
def test_plain_and_digested_keys_are_accepted(client: FlaskClient, key: str) -> None:
    response = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200
    assert response.get_json()["object"] == "list"


def test_health_routes_stay_open(client: FlaskClient) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/openapi.json").status_code == 200


def test_keys_from_the_environment() -> None:
    settings = load_settings(environ={"TRICKLE_API_KEYS": "a, sha256:ABC"})
    assert settings.auth.api_keys == ("a", "sha256:ABC")


def test_a_job_is_visible_only_to_the_key_that_created_it(client: FlaskClient) -> None:
    first = {"Authorization": "Bearer first-key"}
    second = {"Authorization": f"Bearer {DIGESTED}"}
    created = client.post("/v1/jobs", json={"prompt": "mine", "max_tokens": 2}, headers=first)
    assert created.status_code == 202
    job_id = created.get_json()["id"]
    assert client.get(f"/v1/jobs/{job_id}", headers=first).status_code == 200
    for response in (
        client.get(f"/v1/jobs/{job_id}", headers=second),
        client.post(f"/v1/jobs/{job_id}/cancel", headers=second),
        client.get(f"/v1/jobs/{job_id}/events", headers=second),
    ):
        assert response.status_code == 404
        assert response.get_json()["error"]["param"] == "job_id"


def with_fixed_clock(app: Flask, limits: RateLimitSettings) -> FlaskClient:
    """The limiter on a clock 30 s into a minute no other test uses: no wall-clock rollover."""
    now = float(uuid.uuid4().int % 10**6 * WINDOW_SECONDS + 30)
    svc = services(app)
    svc.rate_limiter = RateLimiter(svc.redis, limits, clock=lambda: now)
    return app.test_client()


@pytest.fixture
def limited(settings: Settings, make_app: Callable[[Settings], Flask]) -> FlaskClient:
    limits = RateLimitSettings(requests_per_minute=3, tokens_per_minute=0)
    return with_fixed_clock(make_app(dataclasses.replace(settings, rate_limits=limits)), limits)


def test_requests_per_minute_limit(limited: FlaskClient) -> None:
    address = {"REMOTE_ADDR": f"requests-{uuid.uuid4()}"}
    statuses = [
        limited.post(
            "/v1/jobs", json={"prompt": "x", "max_tokens": 1}, environ_base=address
        ).status_code
        for _ in range(4)
    ]
    assert statuses[:3] == [202, 202, 202]
    assert statuses[3] == 429


def test_tokens_per_minute_limit(settings: Settings, make_app: Callable[[Settings], Flask]) -> None:
    limits = RateLimitSettings(requests_per_minute=0, tokens_per_minute=100)
    app = with_fixed_clock(make_app(dataclasses.replace(settings, rate_limits=limits)), limits)
    address = {"REMOTE_ADDR": f"tokens-{uuid.uuid4()}"}
    ok = app.post("/v1/jobs", json={"prompt": "x", "max_tokens": 90}, environ_base=address)
    assert ok.status_code == 202
    refused = app.post("/v1/jobs", json={"prompt": "x", "max_tokens": 90}, environ_base=address)
    assert refused.status_code == 429
    body = refused.get_json()["error"]
    assert body["code"] == "rate_limit_exceeded" and "tokens" in body["message"]
    assert refused.headers["Retry-After"] == "31"  # the rest of the clock's minute, rounded up
