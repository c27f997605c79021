"""API keys: with keys configured, /v1 wants a valid bearer token; health routes stay open."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient

from trickle.config.sections import AuthSettings
from trickle.config.settings import Settings, load_settings

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
