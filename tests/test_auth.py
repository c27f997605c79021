"""API keys: with keys configured, /v1 wants a valid bearer token; health routes stay open."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from flask.testing import FlaskClient

from web import create_app
from worker.config import AuthSettings, Settings, load_settings

DIGESTED = "second-key"


@pytest.fixture(scope="module")
def client(settings: Settings) -> FlaskClient:
    digest = hashlib.sha256(DIGESTED.encode()).hexdigest()
    keyed = dataclasses.replace(settings, auth=AuthSettings(("first-key", f"sha256:{digest}")))
    return create_app(keyed).test_client()


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
