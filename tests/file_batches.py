"""What the files and file-batch tests send and check: uploads, batch lines and requests as a
key sends them, a batch's tasks and a job run as the batch consumer and a worker would run
them, a batch's jobs and a file's lines."""

from __future__ import annotations

import io
import json
import time
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from trickle import keys
from trickle.job_result import JobResult
from trickle.jobs import FinishReason, JobStatus
from web.batches.sweeper import sweep
from web.batches.tasks import ingest_batch, settle_batch
from web.services import services

# The two API keys the file tests' app accepts: every request is one of theirs.
FIRST, SECOND = "files-key-one", "files-key-two"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def sweep_now(app: Flask, batch_id: str) -> list[str]:
    """A sweep turn, and the tasks it sends for ``batch_id`` run here as the batch consumer
    would run them (other tests' batches in the shared Redis are left alone); the tasks'
    names."""
    svc = services(app)
    svc.redis.delete(keys.batch_sweep())  # a turn of its own
    sent: list[str] = []
    sweep(svc, 0.01, lambda task, found: sent.append(task) if found == batch_id else None)
    for task in sent:
        if task == keys.BATCH_INGEST_TASK:
            ingest_batch(app, batch_id)
        else:
            settle_batch(svc, batch_id)
    return sent


def upload(client: FlaskClient, data: bytes, purpose: str = "batch", key: str = FIRST) -> Any:
    form = {"purpose": purpose, "file": (io.BytesIO(data), "input.jsonl")}
    return client.post("/v1/files", data=form, headers=bearer(key))


def line(custom_id: str, url: str = "/v1/chat/completions", **body: Any) -> dict[str, Any]:
    if url == "/v1/chat/completions":
        body = {"model": "bound", "messages": [{"role": "user", "content": "hi"}], **body}
    else:
        body = {"model": "bound", "prompt": "hi", **body}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"max_tokens": 2, **body}}


def jsonl(*lines: dict[str, Any] | str) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def post_batch(client: FlaskClient, file_id: str, key: str = FIRST, **extra: Any) -> Any:
    """``POST /v1/batches`` for the file, as OpenAI's client sends it."""
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    return client.post("/v1/batches", json={**body, **extra}, headers=bearer(key))


def create(client: FlaskClient, file_id: str, key: str = FIRST, **extra: Any) -> Any:
    """``post_batch``, then the batch consumer's reading of its input (the task's own
    function): the batch as a read finds it after, or the POST's refusal."""
    response = post_batch(client, file_id, key, **extra)
    if response.status_code != 200 or response.get_json()["status"] != "validating":
        return response
    batch_id = response.get_json()["id"]
    ingest_batch(client.application, batch_id)
    return client.get(f"/v1/batches/{batch_id}", headers=bearer(key))


def settle(client: FlaskClient, batch_id: str, key: str = FIRST) -> Any:
    """The batch consumer's settle task (its function), then the batch as a read finds it."""
    settle_batch(services(client.application), batch_id)
    return client.get(f"/v1/batches/{batch_id}", headers=bearer(key))


def run_jobs(app: Flask, job_ids: list[str], text: str = "ok") -> None:
    """What a worker does with each job: claim it, then store its result."""
    store = services(app).store
    for job_id in job_ids:
        claim = store.leases.claim(job_id, "w", time.time(), lease_ms=60_000, max_attempts=3)
        assert claim.claimed
        done = JobResult(JobStatus.SUCCEEDED, text, FinishReason.LENGTH, 1, time.time())
        assert store.finish(job_id, claim.fence, done)


def job_ids_of(app: Flask, batch_id: str) -> list[str]:
    entries = services(app).redis.lrange(keys.batch_items(batch_id), 0, -1)
    return [job_id for entry in entries for job_id in json.loads(entry).get("job_ids", [])]


def content(client: FlaskClient, file_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/files/{file_id}/content", headers=bearer(FIRST))
    assert response.status_code == 200
    return [json.loads(x) for x in response.get_data(as_text=True).splitlines()]


def read_in(client: FlaskClient, response: Any, headers: dict[str, str] | None = None) -> Any:
    """A ``POST /v1/batches`` answer's batch after the batch consumer's reading of its input
    (the task's own function), as a read then finds it; a refusal as it came."""
    if response.status_code != 200 or response.get_json()["status"] != "validating":
        return response
    batch_id = response.get_json()["id"]
    ingest_batch(client.application, batch_id)
    return client.get(f"/v1/batches/{batch_id}", headers=headers or {})
