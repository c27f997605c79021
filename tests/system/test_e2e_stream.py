"""Streaming guarantees: every token exactly once, in order, whenever the reader connects."""

from __future__ import annotations

import itertools
import subprocess
import threading
from pathlib import Path

import redis
import requests

from tests import stack
from tests.clients import StreamResult, poll_until_finished, read_sse, read_ws, submit
from tests.faultstack import wait_for

LONG = {"max_tokens": 300, "ignore_eos": True}


def assert_complete(stream: StreamResult, expected_tokens: int | None = None) -> None:
    assert stream.done is not None, "stream ended without done"
    assert stream.indexes == list(range(stream.token_count))
    assert stream.text == stream.done["output"]
    assert stream.token_count == stream.done["usage"]["completion_tokens"]
    if expected_tokens is not None:
        assert stream.token_count == expected_tokens
    # Status events: one per change (and every second while queued: where it stands), the last
    # one the final state, right before done.
    names = changes(stream)
    assert names and names[-1] == stream.done["status"], names
    assert all(a != b for a, b in itertools.pairwise(names)), names


def changes(stream: StreamResult) -> list[str]:
    """The stream's statuses, a queued job's refreshes counted once."""
    names = [status["status"] for status in stream.statuses]
    return [
        name for i, name in enumerate(names) if i == 0 or name != "queued" or names[i - 1] != name
    ]


def test_reader_after_the_job_finished_gets_everything(stack_url: str) -> None:
    job = submit(stack_url, {"prompt": "The", "max_tokens": 50, "ignore_eos": True}, wait=60)
    assert job["status"] == "succeeded"
    stream = read_sse(stack_url, job["id"])
    assert_complete(stream, 50)
    assert stream.text == job["output"]


def test_reader_joining_mid_stream_and_resuming(stack_url: str) -> None:
    job = submit(stack_url, {"prompt": "The module", **LONG})
    head = read_sse(stack_url, job["id"], max_tokens=10)  # then the client drops
    assert head.indexes == list(range(10))
    rest = read_sse(stack_url, job["id"], headers={"Last-Event-ID": "9"})
    assert rest.done is not None
    assert rest.indexes == list(range(10, 300))
    assert head.text + rest.text == rest.done["output"]
    tail = read_sse(stack_url, job["id"], query="?after=289")
    assert tail.indexes == list(range(290, 300))
    assert rest.done["output"].endswith(tail.text)


def test_reader_connected_before_any_worker_serves_the_model(
    stack_url: str, config_path: Path, redis_url: str, log_dir: Path
) -> None:
    job = submit(stack_url, {"prompt": "The", "model": "late", "max_tokens": 40})
    stream = StreamResult()
    reader = threading.Thread(target=lambda: read_sse(stack_url, job["id"], into=stream))
    reader.start()
    # The job waits with no worker: the reader hears where it stands every second.
    wait_for(lambda: len(stream.statuses) >= 3, 30, "status refreshes while the job waits")
    late_worker: subprocess.Popen[bytes] = stack.start_worker(
        config_path, redis_url, "late", log_dir, models=("late",)
    )
    try:
        reader.join(60)
        assert not reader.is_alive()
    finally:
        stack.stop(late_worker)
    assert_complete(stream)
    assert stream.done is not None and stream.done["model"] == "late"
    # Every change, in order: waiting (with its place in line, refreshed), claimed, finished.
    assert changes(stream) == ["queued", "running", "succeeded"]
    waiting = [status for status in stream.statuses if status["status"] == "queued"]
    assert len(waiting) >= 3 and all(isinstance(s["position"], int) for s in waiting)
    assert waiting[0]["eta_seconds"] is None  # no worker served the model: no start to expect


def test_websocket_stream_and_resume(stack_url: str) -> None:
    job = submit(stack_url, {"prompt": "The", "max_tokens": 60, "ignore_eos": True})
    stream = read_ws(stack_url, job["id"])
    assert_complete(stream, 60)
    resumed = read_ws(stack_url, job["id"], query="?after=49")
    assert resumed.indexes == list(range(50, 60))
    assert stream.text.endswith("".join(t["text"] for t in resumed.tokens))


def test_websocket_unknown_job_gets_an_error_event(stack_url: str) -> None:
    stream = read_ws(stack_url, "job_does_not_exist")
    assert stream.done is not None and stream.done["event"] == "error"
    assert stream.done["error"]["type"] == "not_found"


def test_many_readers_share_one_redis_subscription(
    stack_url: str, redis_client: redis.Redis
) -> None:
    job = submit(stack_url, {"prompt": "The", **LONG})
    readers = 40
    results: list[StreamResult] = [StreamResult() for _ in range(readers)]

    def read(i: int) -> None:
        results[i] = read_sse(stack_url, job["id"])

    baseline = len(redis_client.client_list())
    threads = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
    for thread in threads:
        thread.start()
    peak = baseline
    while any(thread.is_alive() for thread in threads):
        peak = max(peak, len(redis_client.client_list()))
        for thread in threads:
            thread.join(0.05)
    final = poll_until_finished(stack_url, job["id"])
    for stream in results:
        assert_complete(stream, 300)
        assert stream.text == final["output"]
    # Readers do not each hold a Redis connection: one shared subscription plus a pool capped
    # at redis.max_connections (8 in the test config), whatever the number of streams.
    assert peak - baseline <= 8 + 1, (baseline, peak)


def test_events_for_unknown_job_is_404(stack_url: str) -> None:
    response = requests.get(f"{stack_url}/v1/jobs/job_nope/events", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["param"] == "job_id"
