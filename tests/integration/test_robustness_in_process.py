"""The outside audit's reproductions that need no running stack: in-process apps on the test Redis,
and plain calls."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import replace

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from ops.redis_server import free_port
from tests.clients import batch_line, jsonl
from tests.file_batches import read_in
from trickle.config.sections import AuthSettings, WebhookSettings
from trickle.config.settings import Settings
from trickle.jobs import BATCH_PRIORITY, new_job_id
from trickle.tenants import DEFAULT_TENANT
from trickle.webhooks import WebhookRejected, check_webhook_url, deliver, resolve_address
from web.services import services


def test_a_first_read_that_fails_closes_its_subscription(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    """Row 1 with Redis away: the follower subscribes, its first read fails, nothing leaks."""
    dead = dataclasses.replace(
        settings,
        redis=dataclasses.replace(settings.redis, url=f"redis://127.0.0.1:{free_port()}/0"),
    )
    app = make_app(dead)
    client = app.test_client()
    job_id = new_job_id()
    for path in (f"/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}"):
        assert client.get(path, headers={"Prefer": "wait=1"}).status_code == 503
    assert services(app).hub.active_subscriptions == 0


def keyed_client(
    settings: Settings, make_app: Callable[[Settings], Flask], metrics_token: str
) -> FlaskClient:
    auth = AuthSettings(api_keys=("keyA", "keyB"), metrics_token=metrics_token)
    return make_app(dataclasses.replace(settings, auth=auth)).test_client()


def test_metrics_want_the_metrics_token_when_one_is_set(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    client = keyed_client(settings, make_app, "sha256:" + hashlib.sha256(b"scrape").hexdigest())
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer keyA"}).status_code == 401
    response = client.get("/metrics", headers={"Authorization": "Bearer scrape"})
    assert response.status_code == 200 and "trickle_active_streams" in response.text
    assert client.get("/healthz").status_code == 200


def test_without_a_metrics_token_metrics_follow_the_api_keys(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    client = keyed_client(settings, make_app, "")
    response = client.get("/metrics")
    assert response.status_code == 401 and response.get_json()["error"]["code"]
    assert client.get("/metrics", headers={"Authorization": "Bearer keyB"}).status_code == 200


def test_batch_jobs_and_backlog_are_bounded(
    settings: Settings, make_app: Callable[[Settings], Flask], redis_client: redis.Redis
) -> None:
    # The backlog is checked before the answer, by lines (each makes a job at least).
    waiting = services(make_app(settings)).queues.depth("demo", DEFAULT_TENANT, BATCH_PRIORITY)
    limits = dataclasses.replace(settings.limits, max_batch_backlog=waiting + 1)
    client = make_app(dataclasses.replace(settings, limits=limits)).test_client()
    response = client.post("/v1/batches", data=jsonl([batch_line("a"), batch_line("b")]))
    assert response.status_code == 429 and response.headers["Retry-After"]
    assert response.get_json()["error"]["code"] == "batch_queue_full"
    # Jobs are counted as the lines are read: the lines past the batch's bound fail alone.
    limits = dataclasses.replace(settings.limits, max_batch_jobs=100)
    client = make_app(dataclasses.replace(settings, limits=limits)).test_client()
    lines = [batch_line(f"r{i}", prompt=["The"] * 2, n=8) for i in range(10)]  # 16 jobs each
    batch = read_in(client, client.post("/v1/batches", data=jsonl(lines))).get_json()
    try:
        assert batch["request_counts"] == {"total": 10, "completed": 0, "failed": 4}
        output = client.get(f"/v1/batches/{batch['id']}/output").get_data(as_text=True)
        failed = [json.loads(line) for line in output.splitlines()]
        assert [line["custom_id"] for line in failed] == ["r6", "r7", "r8", "r9"]
        assert {line["error"]["code"] for line in failed} == {"batch_job_limit"}
    finally:
        client.post(f"/v1/batches/{batch['id']}/cancel")  # its queued jobs go away


def test_webhook_hosts_resolving_to_internal_addresses_are_refused_at_delivery() -> None:
    strict = WebhookSettings(allowed_hosts=("localhost", "127.0.0.1"), allowed_ports=(8080,))
    for host in ("localhost", "127.0.0.1"):
        with pytest.raises(WebhookRejected, match="internal address"):
            deliver(f"http://{host}:8080/hook", {}, strict)
    assert resolve_address("127.0.0.1", 8080, replace(strict, allow_private_addresses=True))
    with pytest.raises(WebhookRejected, match="allowed_ports"):
        check_webhook_url("http://localhost/hook", strict)  # port 80 by default
