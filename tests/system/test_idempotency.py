"""Submitting is safe to retry: a POST never hides a job it created, and an Idempotency-Key makes
a retry return the first job. On a real stack: an embedded Redis with its append-only file, that
the tests SIGKILL and restart; gunicorn; a Celery worker; a small model.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from tests.clients import poll_until_finished
from tests.faultstack import FaultStack, build_fault_stack, build_slow_model, wait_for
from worker.engine.flags import SHM_PREFIX

LONG = {"model": "slow", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}
HEADER = "Idempotency-Key"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def idem(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    root = tmp_path_factory.mktemp("idempotency")
    slow = build_slow_model(root, demo_model_dir / "tokenizer.model")
    stack = build_fault_stack(
        root,
        models_toml=(
            f'[models.demo]\npath = "{demo_model_dir}"\n'
            f'[models.slow]\npath = "{slow}"\nmax_batch_size = 4\nintra_threads = 1\n'
        ),
        settings_toml=(
            "[worker]\nlease_seconds = 2\nrecovery_interval_seconds = 0.5\n"
            "heartbeat_seconds = 0.5\nredis_retry_seconds = 60\n"
            "[limits]\nmax_tokens_ceiling = 2000\n"
        ),
        append_only=True,
    )
    stack.worker("runner", ("demo", "slow"))
    yield stack
    stack.close()


def post(base: str, path: str, body: Any, key: str | None = None, **headers: str) -> Any:
    sent = {**headers, **({HEADER: key} if key is not None else {})}
    return requests.post(f"{base}{path}", json=body, headers=sent, timeout=60)


def job_count(stack: FaultStack) -> int:
    with stack.client() as client:
        return sum(1 for _ in client.scan_iter(match="trickle:*:job:job_*", count=1000)
                   if str(_).count(":") == 3)  # fmt: skip


def kill_redis(stack: FaultStack) -> None:
    os.kill(stack.redis_process.pid, signal.SIGKILL)
    stack.redis_process.wait(10)


def restart_redis(stack: FaultStack) -> None:
    stack.start_redis(append_only=True)
    with stack.client() as client:
        wait_for(lambda: client.ping(), 10, "redis")


def test_a_bad_key_is_a_400_naming_the_header(idem: FaultStack) -> None:
    for bad in ("", "k" * 256):
        response = post(idem.web_url, "/v1/jobs", {"prompt": "The", "max_tokens": 1}, bad)
        assert response.status_code == 400, (bad, response.text)
        assert response.json()["error"]["param"] == HEADER
    ok = post(idem.web_url, "/v1/jobs", {"prompt": "The", "max_tokens": 1}, "k" * 255)
    assert ok.status_code == 202


def test_the_same_key_returns_the_first_job_and_another_body_is_a_422(idem: FaultStack) -> None:
    key = f"retry-{uuid.uuid4()}"
    body = {"prompt": "Once", "model": "demo", "max_tokens": 8}
    before = job_count(idem)
    first = post(idem.web_url, "/v1/jobs", body, key)
    again = post(idem.web_url, "/v1/jobs", body, key)
    assert first.status_code == 202 and again.status_code in (200, 202)
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Location"] == f"/v1/jobs/{first.json()['id']}"
    assert job_count(idem) == before + 1
    finished = poll_until_finished(idem.web_url, first.json()["id"], timeout=30)
    replay = post(idem.web_url, "/v1/jobs", body, key)  # finished: the finished job
    assert replay.status_code == 200 and replay.json()["output"] == finished["output"]
    other = post(idem.web_url, "/v1/jobs", {**body, "max_tokens": 9}, key)
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert job_count(idem) == before + 1


def test_two_concurrent_posts_with_one_key_create_one_job(idem: FaultStack) -> None:
    key = f"race-{uuid.uuid4()}"
    body = {"prompt": "Race", "model": "demo", "max_tokens": 4}
    before = job_count(idem)
    barrier = threading.Barrier(8)
    answers: list[requests.Response] = []

    def send() -> None:
        barrier.wait()
        answers.append(post(idem.web_url, "/v1/jobs", body, key))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert {a.status_code for a in answers} <= {200, 202}, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert job_count(idem) == before + 1


def test_openai_routes_and_batches_replay_the_first_request(idem: FaultStack) -> None:
    body = {"model": "demo", "prompt": "The", "max_tokens": 4, "temperature": 0}
    key = f"oa-{uuid.uuid4()}"
    first = post(idem.web_url, "/v1/completions", body, key)
    again = post(idem.web_url, "/v1/completions", body, key)
    assert first.status_code == again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["choices"] == first.json()["choices"]
    chat = {"model": "demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    chat_key = f"chat-{uuid.uuid4()}"
    ids = {post(idem.web_url, "/v1/chat/completions", chat, chat_key).json()["id"] for _ in "ab"}
    assert len(ids) == 1
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}
    batch_key = f"batch-{uuid.uuid4()}"
    batches = [
        requests.post(
            f"{idem.web_url}/v1/batches",
            data=json.dumps(line) + "\n",
            headers={HEADER: batch_key, "Content-Type": "application/jsonl"},
            timeout=30,
        )
        for _ in "ab"
    ]
    assert [b.status_code for b in batches] == [200, 200], batches[1].text
    assert batches[0].json()["id"] == batches[1].json()["id"]


def test_redis_killed_during_the_wait_answers_202_with_the_job(idem: FaultStack) -> None:
    """Redis dies after the job is recorded and before the wait ends: the answer names the job
    (202, Location), says the wait was cut short, and the job runs to its end once Redis is
    back (from its append-only file)."""
    answer: list[requests.Response] = []
    body = {"prompt": "Long", **LONG}
    sender = threading.Thread(
        target=lambda: answer.append(
            requests.post(f"{idem.web_url}/v1/jobs", json=body,
                          headers={"Prefer": "wait=20"}, timeout=60)
        )
    )  # fmt: skip
    sender.start()
    time.sleep(0.6)
    kill_redis(idem)
    try:
        sender.join(60)
    finally:
        restart_redis(idem)
    (response,) = answer
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert "Trickle-Wait-Interrupted" in response.headers
    final = poll_until_finished(idem.web_url, job["id"], timeout=90)
    assert final["status"] == "succeeded" and final["usage"]["completion_tokens"] == 1500


def test_a_retry_during_a_redis_outage_creates_one_job(idem: FaultStack) -> None:
    """The first POST created the job; Redis dies; the client retries with the same key: a 503
    that says nothing was created, while Redis is down; once it is back (restarted from its
    append-only file) the retry returns the first job, and only one exists."""
    key = f"outage-{uuid.uuid4()}"
    body = {"prompt": "Outage", "model": "demo", "max_tokens": 4}
    first = post(idem.web_url, "/v1/jobs", body, key)
    assert first.status_code == 202
    before = job_count(idem)
    kill_redis(idem)
    try:
        during = post(idem.web_url, "/v1/jobs", body, key)
        assert during.status_code == 503 and "Retry-After" in during.headers
    finally:
        restart_redis(idem)
    after = wait_for(
        lambda: (r := post(idem.web_url, "/v1/jobs", body, key)).status_code != 503 and r,
        30,
        "the web tier to reach Redis again",
    )
    assert after.json()["id"] == first.json()["id"]
    assert job_count(idem) == before


def test_completions_whose_wait_fails_name_their_jobs(idem: FaultStack) -> None:
    answer: list[requests.Response] = []
    body = {"model": "slow", "prompt": "Long", "max_tokens": 1500, "ignore_eos": True}
    sender = threading.Thread(
        target=lambda: answer.append(post(idem.web_url, "/v1/completions", body))
    )
    sender.start()
    time.sleep(0.6)
    kill_redis(idem)
    try:
        sender.join(60)
    finally:
        restart_redis(idem)
    (response,) = answer
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert len(error["job_ids"]) == 1 and error["job_ids"][0] in error["message"]
    final = poll_until_finished(idem.web_url, error["job_ids"][0], timeout=90)
    assert final["status"] in ("succeeded", "canceled")


def test_a_worker_killed_mid_generation_leaves_no_shared_memory(idem: FaultStack) -> None:
    idem.stop_workers()
    doomed = idem.worker("doomed", ("slow",))
    try:
        job = post(idem.web_url, "/v1/jobs", {"prompt": "Kill", **LONG}).json()
        with idem.client() as client:
            wait_for(lambda: _running(client, job["id"], "doomed"), 30, "the doomed worker's run")
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(10)
        time.sleep(0.5)
        leftovers = [p.name for p in Path("/dev/shm").glob(f"{SHM_PREFIX}{doomed.pid}_*")]
        assert leftovers == []
        idem.worker("next-life", ("slow",))  # the next life starts, and sweeps
        assert [p.name for p in Path("/dev/shm").glob(f"{SHM_PREFIX}{doomed.pid}_*")] == []
        final = poll_until_finished(idem.web_url, job["id"], timeout=90)
        assert final["status"] == "succeeded"
    finally:
        idem.stop_workers()
        idem.worker("runner", ("demo", "slow"))


def _running(client: redis.Redis, job_id: str, node: str) -> bool:
    from trickle import keys

    owner = str(client.hget(keys.job(job_id), "owner") or "")
    return owner.startswith(f"{node}@") and client.llen(keys.job_tokens(job_id)) > 10
