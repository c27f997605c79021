"""Stream URLs and CORS over plain HTTP: what a job's token opens and what it never opens.

In-process apps on the test Redis check the token's scope, tampering, expiry and CORS; a real
gunicorn with API keys (configured through the environment, as an operator would) streams a
whole job over SSE and WebSocket with nothing but the URLs a backend received.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from trickle import keys
from trickle.config.sections import AuthSettings, WebSettings
from trickle.config.settings import ConfigError, Settings, load_settings
from web.services import services
from web.streams.tokens import StreamTokens, load_secret

KEY = "stream-access-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PAGE_ORIGIN = "http://127.0.0.1:5173"
MISSING_JOB = "job_" + "0" * 32


@pytest.fixture(scope="module")
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Flask:
    web = dataclasses.replace(settings.web, cors_origins=(PAGE_ORIGIN,))
    return make_app(dataclasses.replace(settings, web=web, auth=AuthSettings((KEY,))))


@pytest.fixture(scope="module")
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def submit(client: FlaskClient, model: str = "late") -> dict[str, Any]:
    """A job no worker serves: it stays queued, which is all these tests need."""
    response = client.post("/v1/jobs", json={"prompt": "Hi", "model": model}, headers=AUTH)
    assert response.status_code == 202, response.get_json()
    return dict(response.get_json())


def token_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["token"][0]


def path_of(url: str) -> str:
    return urlsplit(url).path


def assert_invalid_token(response: Any) -> None:
    assert response.status_code == 401
    error = response.get_json()["error"]
    assert error["param"] == "token" and error["code"] == "invalid_stream_token"


def test_every_job_object_carries_absolute_urls_without_the_key(client: FlaskClient) -> None:
    job = submit(client)
    urls = job["urls"]
    base = f"http://localhost/v1/jobs/{job['id']}"
    assert urls["self"] == base and urls["cancel"] == f"{base}/cancel"
    assert urls["stream"].startswith(f"{base}/events?token=")
    assert urls["ws"].startswith(f"ws://localhost/v1/jobs/{job['id']}/ws?token=")
    assert token_of(urls["stream"]) == token_of(urls["ws"])
    for url in urls.values():
        assert KEY not in url and "Bearer" not in url
    again = client.get(f"/v1/jobs/{job['id']}", headers=AUTH).get_json()
    assert again["urls"]["self"] == base  # GET and cancel answer job objects with urls too
    canceled = client.post(f"/v1/jobs/{job['id']}/cancel", headers=AUTH).get_json()
    assert canceled["status"] == "canceled" and "urls" in canceled


def test_the_token_reads_its_job_and_nothing_else(client: FlaskClient) -> None:
    job, other = submit(client), submit(client)
    token = token_of(job["urls"]["stream"])
    read = client.get(f"/v1/jobs/{job['id']}?token={token}")
    assert read.status_code == 200 and read.get_json()["id"] == job["id"]
    events = client.get(path_of(job["urls"]["stream"]) + f"?token={token}", buffered=False)
    assert events.status_code == 200 and events.mimetype == "text/event-stream"
    events.close()
    # Not cancel, not another job, not another route: without a key they want the key.
    cancel = client.post(f"/v1/jobs/{job['id']}/cancel?token={token}")
    assert cancel.status_code == 401
    assert client.get(f"/v1/jobs/{job['id']}", headers=AUTH).get_json()["status"] == "queued"
    assert_invalid_token(client.get(f"/v1/jobs/{other['id']}?token={token}"))
    assert_invalid_token(client.get(f"/v1/jobs/{other['id']}/events?token={token}"))
    assert client.get(f"/v1/models?token={token}").status_code == 401


def test_tampered_expired_and_foreign_tokens_are_one_json_401(
    app: Flask, client: FlaskClient
) -> None:
    job = submit(client)
    token = token_of(job["urls"]["stream"])
    expiry, signature = token.split(".")
    signer = services(app).stream_tokens()
    tampered = [
        f"{expiry}.{signature[:-1]}{'A' if signature[-1] != 'A' else 'B'}",  # one character
        f"{int(expiry) + 1}.{signature}",  # a later expiry, same signature
        signer.issue(job["id"], int(time.time()) - 1),  # genuinely signed, expired
        StreamTokens(b"another-secret").issue(job["id"], int(time.time()) + 60),  # foreign
        "",
        "garbage",
        "9" * 40 + "." + signature,
        f"{expiry}.{signature}é",
    ]
    bodies = set()
    for bad in tampered:
        for path in (f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id']}/events"):
            response = client.get(path, query_string={"token": bad})
            assert_invalid_token(response)
            bodies.add(response.get_data(as_text=True))
        # The same answer whether the job exists or not.
        missing = client.get(f"/v1/jobs/{MISSING_JOB}", query_string={"token": bad})
        assert_invalid_token(missing)
        bodies.add(missing.get_data(as_text=True))
    assert len(bodies) == 1
    # A valid token for a job that does not exist (or has expired) is the usual JSON 404.
    for_missing = signer.issue(MISSING_JOB, int(time.time()) + 60)
    response = client.get(f"/v1/jobs/{MISSING_JOB}?token={for_missing}")
    assert response.status_code == 404 and response.get_json()["error"]["param"] == "job_id"


def test_the_generated_secret_is_created_once_and_shared(
    settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> None:
    first = make_app(settings)
    second = make_app(settings)
    token = services(first).stream_tokens().issue("job_" + "1" * 32, int(time.time()) + 60)
    assert services(second).stream_tokens().verify("job_" + "1" * 32, token, time.time())
    stored = redis_client.get(keys.STREAM_SECRET)
    assert stored and len(stored) == 64
    assert load_secret(redis_client, "") == stored.encode()  # SET NX: never replaced
    configured = dataclasses.replace(settings.web, stream_secret="configured")
    own = make_app(dataclasses.replace(settings, web=configured))
    assert not services(own).stream_tokens().verify("job_" + "1" * 32, token, time.time())


def test_cors_preflight_allowed_before_any_key(client: FlaskClient) -> None:
    response = client.options(
        "/v1/jobs",
        headers={
            "Origin": PAGE_ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert response.status_code == 204
    headers = response.headers
    assert headers["Access-Control-Allow-Origin"] == PAGE_ORIGIN
    assert headers["Access-Control-Allow-Credentials"] == "true"
    assert "POST" in headers["Access-Control-Allow-Methods"]
    allowed = {h.strip().lower() for h in headers["Access-Control-Allow-Headers"].split(",")}
    assert {"authorization", "content-type", "last-event-id", "prefer", "cancel-after"} <= allowed
    assert "Origin" in headers["Vary"]
    # The actual request (a 401 too) tells the page what happened.
    job = client.post("/v1/jobs", json={"prompt": "Hi", "model": "late"}, headers={
        **AUTH, "Origin": PAGE_ORIGIN})  # fmt: skip
    assert job.headers["Access-Control-Allow-Origin"] == PAGE_ORIGIN
    assert "Location" in job.headers["Access-Control-Expose-Headers"]
    # The page may read the answer's hops: the header, and its Resource Timing entry's.
    assert "Server-Timing" in job.headers["Access-Control-Expose-Headers"]
    assert job.headers["Timing-Allow-Origin"] == PAGE_ORIGIN
    refused = client.get("/v1/models", headers={"Origin": PAGE_ORIGIN})
    assert refused.status_code == 401
    assert refused.headers["Access-Control-Allow-Origin"] == PAGE_ORIGIN


def test_cors_unlisted_origins_get_no_cors_headers(client: FlaskClient) -> None:
    for origin in ("http://evil.example", "http://127.0.0.1:5174", "null"):
        preflight = client.options(
            "/v1/jobs", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
        )
        assert preflight.status_code != 204
        read = client.get("/v1/models", headers={**AUTH, "Origin": origin})
        for response in (preflight, read):
            assert not any(
                h.lower().startswith("access-control-") for h, _ in response.headers.items()
            )
            assert "Timing-Allow-Origin" not in response.headers
        assert "Origin" in read.headers["Vary"]
    assert "Access-Control-Allow-Origin" not in client.get("/healthz", headers={
        "Origin": PAGE_ORIGIN}).headers  # fmt: skip


def test_cors_wildcard_never_comes_with_credentials(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    web = dataclasses.replace(settings.web, cors_origins=("*", PAGE_ORIGIN))
    wild = make_app(dataclasses.replace(settings, web=web)).test_client()
    preflight = wild.options(
        "/v1/jobs",
        headers={"Origin": "https://any.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in preflight.headers
    assert preflight.headers["Timing-Allow-Origin"] == "*"
    listed = wild.get("/v1/models", headers={"Origin": PAGE_ORIGIN})
    assert listed.headers["Access-Control-Allow-Origin"] == PAGE_ORIGIN
    assert listed.headers["Access-Control-Allow-Credentials"] == "true"
    assert listed.headers["Timing-Allow-Origin"] == PAGE_ORIGIN


def test_cors_origins_from_the_environment_and_checked() -> None:
    env = {"TRICKLE__WEB__CORS_ORIGINS": "https://a.example, http://127.0.0.1:8080"}
    settings = load_settings(environ=env)
    assert settings.web.cors_origins == ("https://a.example", "http://127.0.0.1:8080")
    assert WebSettings().cors_origins == ()
    for bad in ("https://a.example/path", "a.example", "https://user@a.example", "ftp://a"):
        with pytest.raises(ConfigError, match=r"web\.cors_origins"):
            load_settings(environ={"TRICKLE__WEB__CORS_ORIGINS": bad})
