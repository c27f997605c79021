"""A job queued behind a full worker hears where it stands and when it will start, on every
route: native SSE status events, OpenAI stream comments (read raw, and ignored by the official
client unchanged) and GET job. A real stack: Redis, gunicorn, one Celery worker with one slot on
a small slow model, so a long job fills the worker while the tests queue theirs behind it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import requests

from tests.faultstack import FaultStack, build_fault_stack, build_slow_model, wait_for

pytestmark = pytest.mark.timeout(180)

LONG = {"model": "slow", "prompt": "The", "max_tokens": 1500, "ignore_eos": True}


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    root = tmp_path_factory.mktemp("waiting")
    slow = build_slow_model(root, demo_model_dir / "tokenizer.model")
    stack = build_fault_stack(
        root,
        models_toml=(
            f'[models.demo]\npath = "{demo_model_dir}"\n'
            f'[models.slow]\npath = "{slow}"\nmax_batch_size = 1\ninter_threads = 1\n'
            "intra_threads = 1\n"
        ),
        settings_toml="[worker]\nheartbeat_seconds = 0.5\n[limits]\nmax_tokens_ceiling = 2000\n",
    )
    stack.worker("one-slot", ("slow",))
    yield stack
    stack.close()


@pytest.fixture
def blocker(full: FaultStack) -> Iterator[str]:
    """A long job that holds the worker's one slot, running (and measured) when the test
    starts; canceled at its end."""
    job_id = requests.post(f"{full.web_url}/v1/jobs", json=LONG, timeout=30).json()["id"]
    wait_for(lambda: job(full, job_id)["usage"]["completion_tokens"] > 2, 60, "the blocker runs")
    time.sleep(1.5)  # its worker's outlook (every 0.5 s) and the web's reading of it follow
    yield job_id
    requests.post(f"{full.web_url}/v1/jobs/{job_id}/cancel", timeout=30)


def job(stack: FaultStack, job_id: str) -> Any:
    return requests.get(f"{stack.web_url}/v1/jobs/{job_id}", timeout=30).json()


def submit(stack: FaultStack, max_tokens: int = 8) -> str:
    body = {"model": "slow", "prompt": "The", "max_tokens": max_tokens}
    return str(requests.post(f"{stack.web_url}/v1/jobs", json=body, timeout=30).json()["id"])


def test_native_stream_and_get_job_tell_position_and_eta(full: FaultStack, blocker: str) -> None:
    job_id = submit(full)
    statuses: list[dict[str, Any]] = []
    started = time.monotonic()
    with requests.get(f"{full.web_url}/v1/jobs/{job_id}/events", stream=True, timeout=30) as reply:
        event = ""
        for line in reply.iter_lines(decode_unicode=True):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "status":
                statuses.append(json.loads(line[6:]))
            if len(statuses) >= 3 or time.monotonic() - started > 10:
                break
    elapsed = time.monotonic() - started
    assert len(statuses) == 3, statuses
    assert elapsed < 3.5  # the first at once, then a refresh at least every second
    for status in statuses:
        assert status["status"] == "queued" and status["position"] == 0
        assert isinstance(status["eta_seconds"], float) and status["eta_seconds"] > 0
    queued = job(full, job_id)["queued"]
    assert queued["position"] == 0 and queued["eta_seconds"] > 0
    requests.post(f"{full.web_url}/v1/jobs/{job_id}/cancel", timeout=30)


def test_openai_stream_comments_say_where_the_job_stands(full: FaultStack, blocker: str) -> None:
    ahead = submit(full)
    body = {"model": "slow", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    comments: list[str] = []
    with httpx.stream("POST", f"{full.web_url}/v1/chat/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith(": queued"):
                comments.append(line)
            if len(comments) >= 2:
                break
    assert len(comments) == 2
    for comment in comments:
        fields = dict(part.split("=") for part in comment.removeprefix(": queued ").split())
        assert fields["position"] == "1"  # behind the job submitted before it
        assert float(fields["eta_seconds"]) > 0
    requests.post(f"{full.web_url}/v1/jobs/{ahead}/cancel", timeout=30)


def test_the_official_client_streams_through_the_comments(full: FaultStack, blocker: str) -> None:
    client = openai.OpenAI(base_url=f"{full.web_url}/v1", api_key="-", max_retries=0)
    chunks: list[Any] = []

    def read() -> None:
        stream = client.chat.completions.create(
            model="slow",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            stream=True,
        )
        chunks.extend(stream)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(2.5)  # queued behind the blocker: two comments or more went out meanwhile
    assert reader.is_alive()
    requests.post(f"{full.web_url}/v1/jobs/{blocker}/cancel", timeout=30)
    reader.join(60)
    assert not reader.is_alive()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason is not None
