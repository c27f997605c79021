"""Bad input gets a 4xx with a JSON error naming the field, never a 500 (in-process app)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from trickle import keys
from trickle.config.settings import Settings


@pytest.fixture(scope="module")
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Flask:
    return make_app(settings)


@pytest.fixture
def client(app: Flask) -> Iterator[FlaskClient]:
    with app.test_client() as client:
        yield client


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({}, 400, "prompt"),
        ({"prompt": 5}, 400, "prompt"),
        ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens"),
        ({"prompt": "hi", "max_tokens": "10"}, 400, "max_tokens"),
        ({"prompt": "hi", "max_tokens": True}, 400, "max_tokens"),
        ({"prompt": "hi", "temperature": -1}, 400, "temperature"),
        ({"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ({"prompt": "hi", "top_p": 0}, 400, "top_p"),
        ({"prompt": "hi", "top_k": -2}, 400, "top_k"),
        ({"prompt": "hi", "stop": 3}, 400, "stop"),
        ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"prompt": "hi", "stop": [""]}, 400, "stop"),
        ({"prompt": "hi", "seed": -1}, 400, "seed"),
        ({"prompt": "hi", "seed": 1.5}, 400, "seed"),
        ({"prompt": "hi", "ignore_eos": "yes"}, 400, "ignore_eos"),
        ({"prompt": "hi", "model": 7}, 400, "model"),
        ({"prompt": "hi", "model": "gpt-17"}, 404, "model"),
        ({"prompt": "hi", "cache_salt": ""}, 400, "cache_salt"),
        ({"prompt": "hi", "cache_salt": "s" * 257}, 400, "cache_salt"),
        ({"prompt": "hi", "cache_salt": 7}, 400, "cache_salt"),
        ({"prompt": "hi", "max_token": 5}, 400, "max_token"),
        ({"prompt": "word " * 400}, 400, "prompt"),
        ({"prompt": "hi", "model": "tiny-llama", "max_tokens": 1024}, 400, "max_tokens"),
        ([1, 2], 400, "body"),
        ("just a string", 400, "body"),
    ],
)
def test_bad_fields_are_named(client: FlaskClient, body: Any, status: int, param: str) -> None:
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == status, response.get_json()
    error = response.get_json()["error"]
    assert error["param"] == param
    assert error["message"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "JSON object"),
        (b'{"prompt": "\xff\xfe"}', "UTF-8"),
        (b'{"prompt": "\\ud800"}', "surrogate"),
    ],
)
def test_malformed_bodies(client: FlaskClient, data: bytes, message: str) -> None:
    response = client.post("/v1/jobs", data=data, content_type="application/json")
    assert response.status_code == 400
    assert message in response.get_json()["error"]["message"]


def test_body_too_large_is_413(client: FlaskClient) -> None:
    response = client.post("/v1/jobs", json={"prompt": "x" * 70_000})
    assert response.status_code == 413
    assert response.get_json()["error"]["type"] == "request_too_large"


@pytest.mark.parametrize("prefer", ["wait=soon", "wait=-3"])
def test_bad_prefer_wait(client: FlaskClient, prefer: str) -> None:
    response = client.post("/v1/jobs", json={"prompt": "hi"}, headers={"Prefer": prefer})
    assert response.status_code == 400
    assert response.get_json()["error"]["param"] == "Prefer"


def test_unknown_routes_and_methods_are_json(client: FlaskClient) -> None:
    assert client.get("/v1/nope").get_json()["error"]["type"] == "not_found"
    response = client.delete("/v1/jobs")
    assert response.status_code == 405
    assert response.get_json()["error"]["type"] == "method_not_allowed"


def test_unknown_job_is_404(client: FlaskClient) -> None:
    for response in (
        client.get("/v1/jobs/job_missing"),
        client.post("/v1/jobs/job_missing/cancel"),
        client.get("/v1/jobs/job_missing/events"),
    ):
        assert response.status_code == 404
        assert response.get_json()["error"]["param"] == "job_id"


def test_bad_resume_index_is_400(client: FlaskClient) -> None:
    response = client.get("/v1/jobs/job_x/events?after=ten")
    assert response.status_code == 400
    assert response.get_json()["error"]["param"] == "after"


def test_openapi_document_describes_the_api(client: FlaskClient) -> None:
    document = client.get("/openapi.json").get_json()
    assert document["openapi"].startswith("3.")
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events", "/readyz"} <= set(
        document["paths"]
    )
    request_schema = document["components"]["schemas"]["JobRequest"]
    assert request_schema["required"] == ["prompt"]
    max_tokens = request_schema["properties"]["max_tokens"]["anyOf"][0]
    assert (max_tokens["type"], max_tokens["maximum"]) == ("integer", 1024)


@pytest.mark.parametrize(
    ("body", "status", "param", "code", "message"),
    [
        ([1], 400, "body", None, "request body must be a JSON object"),
        ({}, 400, "prompt", None, "prompt is required"),
        ({"prompt": 5}, 400, "prompt", None, "prompt: Input should be a valid string"),
        ({"prompt": "hi", "model": 7}, 400, "model", None, "model: Input should be a valid string"),
        ({"prompt": "hi", "model": "gpt-17"}, 404, "model", "model_not_found", "model 'gpt-17'"),
        ({"prompt": "a\ud800"}, 400, "prompt", None, "prompt contains an unpaired surrogate at"),
        (
            {"prompt": "hi", "webhook_url": 5},
            400,
            "webhook_url",
            None,
            "webhook_url: Input should be",
        ),
        ({"prompt": "hi", "webhook_url": "http://10.9.9.9/x"}, 400, "webhook_url", None, ""),
        ({"prompt": "hi", "webhook_url": "ftp://127.0.0.1/x"}, 400, "webhook_url", None, ""),
    ],
)
def test_errors_name_the_field_exactly(
    client: FlaskClient, body: Any, status: int, param: str, code: str | None, message: str
) -> None:
    response = client.post(
        "/v1/jobs",
        data=json.dumps(body, ensure_ascii=True),
        content_type="application/json",
    )
    assert response.status_code == status
    error = response.get_json()["error"]
    assert error["param"] == param
    assert error["message"].startswith(message) and error["message"]
    if code is not None:
        assert error["code"] == code


def test_an_allowed_webhook_url_is_kept_and_an_absent_one_is_empty(
    client: FlaskClient, redis_client: redis.Redis
) -> None:
    url = "http://127.0.0.1:9/hook"
    with_hook = client.post("/v1/jobs", json={"prompt": "hi", "webhook_url": url})
    without = client.post("/v1/jobs", json={"prompt": "hi", "webhook_url": None})
    assert with_hook.status_code == without.status_code == 202
    stored = redis_client.hget(keys.job(with_hook.get_json()["id"]), "webhook_url")
    assert stored == url
    assert redis_client.hget(keys.job(without.get_json()["id"]), "webhook_url") is None


def test_a_cache_salt_is_kept_with_the_job(client: FlaskClient) -> None:
    salted = client.post("/v1/jobs", json={"prompt": "hi", "cache_salt": "s" * 256})
    plain = client.post("/v1/jobs", json={"prompt": "hi"})
    assert salted.status_code == plain.status_code == 202
    assert salted.get_json()["params"]["cache_salt"] == "s" * 256
    assert plain.get_json()["params"]["cache_salt"] is None
    chat = {"messages": [{"role": "user", "content": "hi"}], "cache_salt": ["x"]}
    refused = client.post("/v1/chat/completions", json=chat)
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "cache_salt"
