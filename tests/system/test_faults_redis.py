"""Redis faults on a real server: outage answers 503 (never 500 or a hang), open streams end
with an error event, everything recovers without restarts, and with AOF on a Redis restart
loses no accepted job."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.clients import StreamResult, poll_until_finished, read_sse, submit
from tests.faultstack import FaultStack, build_fault_stack, wait_for

# Each test starts and kills real processes: a longer ceiling than the suite's 60 s.
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    models = "".join(f'[models.{name}]\npath = "{demo_model_dir}"\n' for name in ("demo", "nobody"))
    stack = build_fault_stack(
        tmp_path_factory.mktemp("redis-faults"),
        models_toml=models,
        settings_toml=(
            "[worker]\nheartbeat_seconds = 0.5\nrecovery_interval_seconds = 0.5\n"
            "[web]\nkeepalive_seconds = 1.0\n"
        ),
        append_only=True,
    )
    stack.worker("redis-faults", ("demo",))
    yield stack
    stack.close()


def ready(base: str) -> bool:
    return requests.get(f"{base}/readyz", timeout=10).status_code == 200


def test_outage_is_503_with_retry_after_and_recovers_without_restarts(faults: FaultStack) -> None:
    base = faults.web_url
    assert wait_for(lambda: ready(base), 30, "ready before the outage")
    waiting = submit(base, {"prompt": "The", "model": "nobody"})
    results: list[StreamResult] = []
    opened = threading.Event()
    reader = threading.Thread(
        target=lambda: results.append(read_sse(base, waiting["id"], opened=opened))
    )
    reader.start()
    assert opened.wait(30), "the stream never opened"
    faults.stop_redis()
    try:
        started = time.monotonic()
        response = requests.post(f"{base}/v1/jobs", json={"prompt": "The"}, timeout=30)
        assert response.status_code == 503
        assert int(response.headers["Retry-After"]) > 0
        assert response.json()["error"]["type"] == "service_unavailable"
        assert time.monotonic() - started < 15  # an answer, not a hang
        readiness = requests.get(f"{base}/readyz", timeout=10)
        assert readiness.status_code == 503
        assert "redis" in readiness.json()["reason"]
        assert requests.get(f"{base}/v1/jobs/job_{'0' * 32}", timeout=10).status_code == 503
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
        reader.join(30)
        (stream,) = results
        assert stream.error is not None and stream.error["type"] == "service_unavailable"
    finally:
        faults.start_redis(append_only=True)
    # Back without restarting anything: the worker reconnects and heartbeats, the web tier
    # serves again, and new jobs run to the end.
    wait_for(lambda: ready(base), 60, "ready after the outage", interval=0.5)
    job = submit(base, {"prompt": "The", "max_tokens": 20, "ignore_eos": True}, wait=30)
    assert job["status"] == "succeeded" and job["usage"]["completion_tokens"] == 20
    assert read_sse(base, job["id"]).text == job["output"]


def test_with_aof_a_redis_restart_loses_no_accepted_job(faults: FaultStack) -> None:
    base = faults.web_url
    wait_for(lambda: ready(base), 60, "ready", interval=0.5)
    accepted = [
        submit(base, {"prompt": f"Job {i}", "model": "nobody", "max_tokens": 8}) for i in range(5)
    ]
    faults.stop_redis()  # a clean shutdown: Redis finishes writing its append-only file
    faults.start_redis(append_only=True)
    wait_for(lambda: ready(base), 60, "ready after restart", interval=0.5)
    faults.worker("aof-late", ("nobody",))
    finished = [poll_until_finished(base, job["id"], timeout=60) for job in accepted]
    assert [job["status"] for job in finished] == ["succeeded"] * 5
