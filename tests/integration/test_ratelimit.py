"""Rate limits per key (Flask-Limiter on the test Redis) and OpenAI's x-ratelimit-* headers."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient

from trickle.config.sections import RateLimitSettings
from trickle.config.settings import Settings
from trickle.tenants import build_keys
from web.admission.ratelimit import reset_text

HEADERS = [
    f"x-ratelimit-{what}-{kind}"
    for kind in ("requests", "tokens")
    for what in ("limit", "remaining", "reset")
]


@pytest.fixture
def client(settings: Settings, make_app: Callable[[Settings], Flask]) -> FlaskClient:
    """Two named keys of the test's own (fresh counters), a third without limits of its own."""
    suffix = uuid.uuid4().hex[:8]
    tables = {
        f"a-{suffix}": {"key": f"ka-{suffix}", "requests_per_minute": 3, "tokens_per_minute": 50},
        f"b-{suffix}": {"key": f"kb-{suffix}", "requests_per_minute": 100},
        f"c-{suffix}": {"key": f"kc-{suffix}"},
    }
    defaults = RateLimitSettings(requests_per_minute=7, tokens_per_minute=0)
    keyed = dataclasses.replace(settings, keys=build_keys(tables), rate_limits=defaults)
    app = make_app(keyed)
    app.config["suffix"] = suffix
    return app.test_client()


def key(client: FlaskClient, role: str) -> dict[str, str]:
    assert client.application.config["suffix"]
    return {"Authorization": f"Bearer k{role}-{client.application.config['suffix']}"}


def post(client: FlaskClient, role: str, max_tokens: int = 1):  # type: ignore[no-untyped-def]
    body = {"prompt": "x", "max_tokens": max_tokens}
    return client.post("/v1/jobs", json=body, headers=key(client, role))


def test_every_v1_answer_carries_the_callers_headers(client: FlaskClient) -> None:
    models = client.get("/v1/models", headers=key(client, "a"))
    assert models.status_code == 200
    assert models.headers["x-ratelimit-limit-requests"] == "3"
    assert models.headers["x-ratelimit-remaining-requests"] == "3"
    assert models.headers["x-ratelimit-limit-tokens"] == "50"
    created = post(client, "a", max_tokens=8)
    assert created.status_code == 202
    assert created.headers["x-ratelimit-remaining-requests"] == "2"
    spent = 50 - int(created.headers["x-ratelimit-remaining-tokens"])
    assert spent > 8  # the prompt's tokens and max_tokens
    assert created.headers["x-ratelimit-reset-requests"].endswith("s")
    job = client.get(f"/v1/jobs/{created.get_json()['id']}", headers=key(client, "a"))
    assert all(name in job.headers for name in HEADERS)


def test_one_keys_limits_never_show_in_anothers_answers(client: FlaskClient) -> None:
    post(client, "a")
    b = client.get("/v1/models", headers=key(client, "b"))
    assert b.headers["x-ratelimit-limit-requests"] == "100"
    assert b.headers["x-ratelimit-remaining-requests"] == "100"
    assert "x-ratelimit-limit-tokens" not in b.headers  # no tokens limit: no token headers
    c = client.get("/v1/models", headers=key(client, "c"))
    assert c.headers["x-ratelimit-limit-requests"] == "7"  # [rate_limits], its own counter


def test_over_the_requests_limit_is_429_naming_it(client: FlaskClient) -> None:
    assert [post(client, "a").status_code for _ in range(3)] == [202, 202, 202]
    refused = post(client, "a")
    assert refused.status_code == 429
    error = refused.get_json()["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert "3 requests per minute" in error["message"] and "requests_per_minute" in error["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 61
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert post(client, "b").status_code == 202  # another key is not held back


def test_over_the_tokens_limit_is_429_and_reserves_nothing(client: FlaskClient) -> None:
    refused = post(client, "a", max_tokens=60)
    assert refused.status_code == 429
    assert "50 tokens per minute" in refused.get_json()["error"]["message"]
    assert refused.headers["x-ratelimit-remaining-requests"] == "3"  # not counted
    assert post(client, "a", max_tokens=8).status_code == 202


def test_an_unknown_key_is_401_without_anyones_headers(client: FlaskClient) -> None:
    response = client.get("/v1/models", headers={"Authorization": "Bearer nobody"})
    assert response.status_code == 401
    assert not any(name in response.headers for name in HEADERS)


def test_anonymous_callers_are_limited_by_address(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    limits = RateLimitSettings(requests_per_minute=2, tokens_per_minute=0)
    app = make_app(dataclasses.replace(settings, rate_limits=limits)).test_client()
    address = {"REMOTE_ADDR": f"addr-{uuid.uuid4()}"}
    body = {"prompt": "x", "max_tokens": 1}
    statuses = [app.post("/v1/jobs", json=body, environ_base=address).status_code for _ in range(3)]
    assert statuses == [202, 202, 429]


def test_without_limits_there_are_no_headers(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    response = make_app(settings).test_client().get("/v1/models")
    assert not any(name in response.headers for name in HEADERS)


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.25, "250ms"), (1.0, "1s"), (20.2, "21s"), (65, "1m5s"), (-1, "0ms")]
)
def test_reset_is_written_as_openai_writes_it(seconds: float, text: str) -> None:
    assert reset_text(seconds) == text
