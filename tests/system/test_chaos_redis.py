"""Chaos on the token plane: Redis SIGKILLed twice while jobs stream and clients retry.

Streams follow their jobs over SSE and, like a browser's EventSource, reconnect with
``Last-Event-ID`` after each error event or 503; POSTs carry an ``Idempotency-Key`` and are
retried until they are answered. Redis runs with AOF, fsynced as ``make up`` does by default
(``everysec``) and as the safe choice (``always``), and is restarted from its append-only file
after each kill. Afterwards: every job succeeded, every stream is exact (each index once, in
order, its text the stored output), and each key made one job. Kept short (a thousand tokens per
job, two one-second outages) so it runs with the rest of the system tier;
``test_faults_lost_writes`` is the kill that loses the last writes, made exact.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.faultstack import FaultStack, build_fault_stack, build_slow_model, wait_for
from trickle import keys

pytestmark = pytest.mark.timeout(240)

STREAMS = 4
TOKENS = 1000
KILLS = 2


@pytest.fixture(scope="module", params=["everysec", "always"])
def chaos(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    demo_model_dir: Path,
) -> Iterator[FaultStack]:
    """The stack, its Redis fsyncing its AOF as ``make up``'s default and as the safe choice."""
    root = tmp_path_factory.mktemp(f"chaos-{request.param}")
    slow = build_slow_model(
        root, demo_model_dir / "tokenizer.model", d_model=256, num_layers=4, ffn_dim=768
    )
    stack = build_fault_stack(
        root,
        models_toml=f'[models.demo]\npath = "{slow}"\ninter_threads = 1\n',
        settings_toml=(
            "[worker]\nlease_seconds = 5\nrecovery_interval_seconds = 0.5\n"
            "heartbeat_seconds = 0.5\n"
            "[limits]\nmax_tokens_ceiling = 2000\n"
            "[web]\nkeepalive_seconds = 1.0\n"
        ),
        append_only=True,
        redis_args=("--appendfsync", request.param),
    )
    stack.worker("chaos", ("demo",))
    yield stack
    stack.close()


class Follower:
    """An SSE client that resumes with Last-Event-ID until ``done``, whatever happens between."""

    def __init__(self, base: str, job_id: str):
        self.base, self.job_id = base, job_id
        self.indexes: list[int] = []
        self.text = ""
        self.done: dict[str, Any] | None = None
        self.reconnects = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 180
        while self.done is None and time.monotonic() < deadline:
            headers = {"Last-Event-ID": str(self.indexes[-1])} if self.indexes else {}
            with contextlib.suppress(requests.RequestException):  # cut: resume
                self._read(headers)
            if self.done is None:
                self.reconnects += 1
                time.sleep(0.2)

    def _read(self, headers: dict[str, str]) -> None:
        url = f"{self.base}/v1/jobs/{self.job_id}/events"
        with requests.get(url, headers=headers, stream=True, timeout=30) as response:
            if response.status_code != 200:
                assert response.status_code == 503, response.text
                return
            event: dict[str, str] = {}
            for raw in response.iter_lines(decode_unicode=True):
                if raw and not raw.startswith(":"):
                    name, _, value = raw.partition(": ")
                    event[name] = value
                    continue
                if event.get("event") == "token":
                    token = json.loads(event["data"])
                    self.indexes.append(int(token["index"]))
                    self.text += token["text"]
                elif event.get("event") == "done":
                    self.done = json.loads(event["data"])
                    return
                elif event.get("event") == "error":
                    return
                event = {}


def post_until_answered(base: str, body: dict[str, Any], key: str) -> str:
    """POST with an Idempotency-Key, retried through 503s and refused connections."""

    def attempt() -> str | None:
        try:
            response = requests.post(
                f"{base}/v1/jobs", json=body, headers={"Idempotency-Key": key}, timeout=30
            )
        except requests.RequestException:
            return None
        if response.status_code == 503:
            return None
        assert response.status_code in (200, 202), response.text
        return str(response.json()["id"])

    return str(wait_for(attempt, 90, f"POST {key} answered", interval=0.2))


def flowing(followers: list[Follower]) -> Callable[[], bool]:
    """True once every stream got 20 more tokens than it has now."""
    streamed = [len(follower.indexes) for follower in followers]
    return lambda: all(len(f.indexes) > n + 20 for f, n in zip(followers, streamed, strict=True))


def test_two_redis_kills_leave_every_stream_exact_and_one_job_per_key(chaos: FaultStack) -> None:
    base = chaos.web_url
    body = {"prompt": "The value", "max_tokens": TOKENS, "ignore_eos": True, "temperature": 0}
    with chaos.client() as client:
        wait_for(lambda: client.zcard(keys.model_workers("demo")) > 0, 60, "a worker")
    submitted = {f"chaos-{uuid.uuid4()}": "" for _ in range(STREAMS)}
    for key in submitted:
        submitted[key] = post_until_answered(base, body, key)
    followers = [Follower(base, job_id) for job_id in submitted.values()]
    late: dict[str, str] = {}
    for _ in range(KILLS):
        wait_for(flowing(followers), 60, "every stream flowing")
        with chaos.client() as client:  # still mid-job: each kill hits every stream
            assert all(client.hget(keys.job(j), "status") == "running" for j in submitted.values())
        os.kill(chaos.redis_process.pid, signal.SIGKILL)
        chaos.redis_process.wait(10)
        key = f"chaos-late-{uuid.uuid4()}"
        # A client whose POST meets the outage retries it with the same key until answered.
        poster = threading.Thread(target=lambda k=key: late.update({k: post_until_answered(
            base, {**body, "max_tokens": 40}, k)}))  # fmt: skip
        poster.start()
        time.sleep(1.0)
        chaos.start_redis(append_only=True)
        poster.join(90)
    for follower in followers:
        follower.thread.join(180)
    for key, job_id in late.items():  # the retried POSTs' jobs: answered once, run once
        assert post_until_answered(base, {**body, "max_tokens": 40}, key) == job_id
    for follower in followers:
        done = follower.done
        assert done is not None, f"{follower.job_id}: {len(follower.indexes)} tokens, no done"
        assert done["status"] == "succeeded", done
        assert follower.indexes == list(range(TOKENS)), follower.job_id
        assert follower.text == done["output"]
    reconnects = sum(f.reconnects for f in followers)
    print(f"{KILLS} Redis kills: {STREAMS} streams exact, {reconnects} reconnects")
    assert reconnects >= STREAMS * KILLS  # every stream lived through every outage
