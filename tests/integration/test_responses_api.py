"""The Responses API in process on a real Redis, its job driven the way workers drive one (claim,
fenced token appends, finish): a stream numbered from the token log survives a worker's death
mid-response, resumes from any event, and a response is visible only to the key that made it."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.faultstack import wait_for
from tests.messages_client import append
from trickle import keys
from trickle.config.sections import AuthSettings
from trickle.config.settings import Settings
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, JobStatus
from trickle.store.job_store import JobStore
from web.services import services


@pytest.fixture(scope="module")
def app(settings: Settings, make_app: Callable[[Settings], Flask]) -> Flask:
    return make_app(settings)


def store_of(app: Flask) -> JobStore:
    return services(app).store


def background(client: FlaskClient, **body: Any) -> tuple[str, str]:
    reply = client.post(
        "/v1/responses", json={"model": "late", "input": "hi", "background": True, **body}
    )
    assert reply.status_code == 200, reply.get_json()
    response_id = reply.get_json()["id"]
    return response_id, "job_" + response_id.removeprefix("resp_")


def finish(store: JobStore, job_id: str, fence: str, count: int) -> None:
    output = "".join(f"<{i}>" for i in range(count))
    result = JobResult(JobStatus.SUCCEEDED, output, FinishReason.LENGTH, count, time.time())
    assert store.finish(job_id, fence, result)


def read_events(client: FlaskClient, response_id: str, query: str = "") -> list[dict[str, Any]]:
    reply = client.get(f"/v1/responses/{response_id}?stream=true{query}", buffered=False)
    assert reply.status_code == 200, reply.get_data(as_text=True)
    text = "".join(chunk.decode() for chunk in reply.response)  # type: ignore[union-attr]
    reply.close()
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_a_stream_survives_the_workers_death_and_resumes_exactly(app: Flask) -> None:
    client, store = app.test_client(), store_of(app)
    response_id, job_id = background(client, max_output_tokens=10)
    seen: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: seen.extend(read_events(client, response_id)))
    reader.start()
    first = store.leases.claim(job_id, "a", time.time(), lease_ms=50, max_attempts=5)
    append(store, job_id, first.fence, 0, 3)
    append(store, job_id, first.fence, 3, 2)
    # Worker a dies: its lease lapses, the sweep requeues the job, worker b resumes the log.
    wait_for(lambda: not store.redis.exists(keys.job_lease(job_id)), 5, "a's lease to lapse")
    assert store.leases.recover_orphans(time.time()) == {job_id: "requeued"}
    second = store.leases.claim(job_id, "b", time.time(), lease_ms=60_000, max_attempts=5)
    append(store, job_id, second.fence, 5, 5)
    finish(store, job_id, second.fence, 10)
    reader.join(30)
    assert [e["sequence_number"] for e in seen] == list(range(4 + 10 + 4))
    deltas = [e["delta"] for e in seen if e["type"] == "response.output_text.delta"]
    assert deltas == [f"<{i}>" for i in range(10)]
    assert seen[-1]["type"] == "response.incomplete"
    assert seen[-1]["response"]["output"][0]["content"][0]["text"] == "".join(deltas)
    # Every reconnect sees the same events under the same numbers.
    assert read_events(client, response_id) == seen
    for after in (0, 3, 7, 13, 16):
        assert read_events(client, response_id, f"&starting_after={after}") == seen[after + 1 :]


def test_a_reader_past_the_last_event_waits_for_the_next(app: Flask) -> None:
    client, store = app.test_client(), store_of(app)
    response_id, job_id = background(client)
    claim = store.leases.claim(job_id, "a", time.time(), lease_ms=60_000, max_attempts=5)
    append(store, job_id, claim.fence, 0, 2)  # events 0-5 exist
    seen: list[dict[str, Any]] = []
    reader = threading.Thread(
        target=lambda: seen.extend(read_events(client, response_id, "&starting_after=7"))
    )
    reader.start()
    time.sleep(0.3)
    append(store, job_id, claim.fence, 2, 3)  # events 6, 7, 8: only 8 is news
    finish(store, job_id, claim.fence, 5)
    reader.join(30)
    assert [e["sequence_number"] for e in seen] == list(range(8, 4 + 5 + 4))
    assert seen[0]["delta"] == "<4>"


def test_logprobs_follow_the_log(app: Flask) -> None:
    client, store = app.test_client(), store_of(app)
    response_id, job_id = background(client, include=["message.output_text.logprobs"])
    claim = store.leases.claim(job_id, "a", time.time(), lease_ms=60_000, max_attempts=5)
    append(store, job_id, claim.fence, 0, 3)
    finish(store, job_id, claim.fence, 3)
    events = read_events(client, response_id)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["logprobs"] for d in deltas] == [
        [{"token": f"<{i}>", "logprob": -0.5, "top_logprobs": []}] for i in range(3)
    ]
    part = client.get(f"/v1/responses/{response_id}").get_json()["output"][0]["content"][0]
    assert [entry["token"] for entry in part["logprobs"]] == ["<0>", "<1>", "<2>"]


def test_a_response_is_visible_only_to_the_key_that_created_it(
    settings: Settings, make_app: Callable[[Settings], Flask]
) -> None:
    keyed = dataclasses.replace(settings, auth=AuthSettings(("key-a", "key-b")))
    client = make_app(keyed).test_client()
    mine, other = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    reply = client.post(
        "/v1/responses", json={"model": "late", "input": "x", "background": True}, headers=mine
    )
    response_id = reply.get_json()["id"]
    assert client.get(f"/v1/responses/{response_id}", headers=mine).status_code == 200
    for refused in (
        client.get(f"/v1/responses/{response_id}", headers=other),
        client.get(f"/v1/responses/{response_id}?stream=true", headers=other),
        client.post(f"/v1/responses/{response_id}/cancel", headers=other),
        client.delete(f"/v1/responses/{response_id}", headers=other),
        client.post(
            "/v1/responses",
            json={"model": "late", "input": "x", "previous_response_id": response_id},
            headers=other,
        ),
    ):
        assert refused.status_code == 404
    assert client.post(f"/v1/responses/{response_id}/cancel", headers=mine).status_code == 200
    assert client.delete(f"/v1/responses/{response_id}", headers=mine).status_code == 200


def test_a_stored_response_expires_with_its_job(app: Flask) -> None:
    client, store = app.test_client(), store_of(app)
    response_id, job_id = background(client)
    ttl = store.redis.ttl(keys.response(response_id))
    limits = services(app).settings.limits
    assert 0 < ttl <= limits.queued_ttl_seconds + limits.result_ttl_seconds
    store.redis.delete(keys.job(job_id))  # the job expired (result_ttl)
    reply = client.get(f"/v1/responses/{response_id}?stream=true&starting_after=2")
    assert reply.status_code == 404 and reply.get_json()["error"]["param"] == "response_id"


def test_store_false_keeps_nothing(app: Flask) -> None:
    client = app.test_client()
    reply = client.post("/v1/responses", json={"model": "late", "input": "x", "store": False,
                                               "stream": True}, buffered=False)  # fmt: skip
    first = next(iter(reply.response))  # type: ignore[call-overload]
    response_id = json.loads(first.decode().split("data: ", 1)[1].split("\n")[0])["response"]["id"]
    reply.close()  # a foreground stream's client left: its job is canceled
    assert client.get(f"/v1/responses/{response_id}").status_code == 404
    job = store_of(app).get("job_" + response_id.removeprefix("resp_"))
    assert job is not None and job.status is JobStatus.CANCELED


def test_an_idempotency_key_creates_one_response(app: Flask) -> None:
    client = app.test_client()
    headers = {"Idempotency-Key": f"resp-{time.time()}"}
    body = {"model": "late", "input": "once", "background": True}
    first = client.post("/v1/responses", json=body, headers=headers)
    again = client.post("/v1/responses", json=body, headers=headers)
    assert first.status_code == again.status_code == 200
    assert again.get_json()["id"] == first.get_json()["id"]
    other = client.post("/v1/responses", json={**body, "input": "twice"}, headers=headers)
    assert other.status_code == 422 and other.get_json()["error"]["param"] == "Idempotency-Key"
