"""Named keys at admission: unknown keys, models, priorities and backlogs, each refusal naming
its [keys.<name>] field (and never the key)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient

from trickle.config.settings import Settings
from trickle.tenants import build_keys


@pytest.fixture(scope="module")
def names() -> dict[str, str]:
    """Names of the module's own, so their queues are empty whatever ran before."""
    suffix = uuid.uuid4().hex[:8]
    return {role: f"{role}-{suffix}" for role in ("open", "narrow", "batch", "capped")}


@pytest.fixture(scope="module")
def client(
    settings: Settings, make_app: Callable[[Settings], Flask], names: dict[str, str]
) -> FlaskClient:
    tables = {
        names["open"]: {"key": "key-open"},
        names["narrow"]: {"key": "key-narrow", "allowed_models": ["tiny-llama"]},
        names["batch"]: {"key": "key-batch", "max_priority": 9},
        names["capped"]: {"key": "key-capped", "max_queued_jobs": 2},
    }
    keyed = dataclasses.replace(settings, keys=build_keys(tables))
    return make_app(keyed).test_client()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def submit(client: FlaskClient, key: str, model: str = "demo") -> tuple[int, dict[str, object]]:
    body = {"prompt": "hi", "max_tokens": 1, "model": model}
    response = client.post("/v1/jobs", json=body, headers=bearer(key))
    return response.status_code, response.get_json()


def test_an_unknown_key_is_401(client: FlaskClient) -> None:
    status, body = submit(client, "key-nobody")
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key"  # type: ignore[index]


def test_a_named_key_is_accepted(client: FlaskClient) -> None:
    assert submit(client, "key-open")[0] == 202


def test_a_model_outside_allowed_models_is_403(client: FlaskClient, names: dict[str, str]) -> None:
    status, body = submit(client, "key-narrow", "demo")
    assert status == 403
    error = body["error"]
    assert error["code"] == "model_not_allowed" and error["param"] == "model"  # type: ignore[index]
    assert f"keys.{names['narrow']}.allowed_models" in error["message"]  # type: ignore[index]
    assert "key-narrow" not in str(body)
    assert submit(client, "key-narrow", "tiny-llama")[0] == 202


def test_a_batch_only_key_may_not_submit_interactive_work(
    client: FlaskClient, names: dict[str, str]
) -> None:
    status, body = submit(client, "key-batch")
    assert status == 403
    error = body["error"]
    assert error["code"] == "priority_not_allowed"  # type: ignore[index]
    assert f"keys.{names['batch']}.max_priority" in error["message"]  # type: ignore[index]


def test_max_queued_jobs_is_per_key_and_429(client: FlaskClient, names: dict[str, str]) -> None:
    assert [submit(client, "key-capped")[0] for _ in range(2)] == [202, 202]
    status, body = submit(client, "key-capped")
    assert status == 429
    error = body["error"]
    assert error["code"] == "key_queue_full"  # type: ignore[index]
    assert f"keys.{names['capped']}.max_queued_jobs = 2" in error["message"]  # type: ignore[index]
    assert submit(client, "key-open")[0] == 202  # another key's backlog is its own
