"""Scale to zero and back: `TRICKLE_WORKERS=0:2 make up` on real processes.

The pool starts empty and ready; the first job starts a worker and waits for it (its time to
first token is the cold start plus a moment), an idle worker stops after ``idle_seconds``, and a
burst of long jobs brings the pool to its maximum at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.clients import read_sse, submit
from tests.faultstack import wait_for
from tests.metrics_text import scrape
from tests.upstack import UpStack, start_up

IDLE_SECONDS = 5.0
LONG = {"prompt": "The", "max_tokens": 2000, "ignore_eos": True}


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[UpStack]:
    root = tmp_path_factory.mktemp("autoscale")
    stack = start_up(
        root,
        "[worker]\nheartbeat_seconds = 0.5\n[limits]\nmax_tokens_ceiling = 2000\n"
        # 8 x 2 lanes = 16 slots per worker, so the 50-job burst needs more than one worker.
        f'[models.demo]\npath = "{demo_model_dir}"\nmax_batch_size = 8\ninter_threads = 2\n',
        env={"TRICKLE_WORKERS": "0:2", "TRICKLE__AUTOSCALE__IDLE_SECONDS": str(IDLE_SECONDS)},
    )
    yield stack
    stack.stop()


def live_workers(base: str) -> int:
    ready = requests.get(f"{base}/readyz", timeout=5)
    assert ready.status_code == 200, ready.text
    return int(ready.json()["workers"])


def test_first_job_on_an_empty_pool_waits_for_one_cold_start(scaled: UpStack) -> None:
    ready = requests.get(f"{scaled.base}/readyz", timeout=5).json()
    assert ready["workers"] == 0 and ready["autoscaled"] is True
    assert scrape(scaled.base)['trickle_workers{model="demo"}'] == 0
    started = time.monotonic()
    job = submit(scaled.base, {"prompt": "The", "max_tokens": 50, "ignore_eos": True})
    assert job["status"] == "queued"
    stream = read_sse(scaled.base, job["id"], timeout=60)
    assert stream.done is not None and stream.done["status"] == "succeeded"
    ttft = stream.arrivals[0] - started

    def cold_start() -> dict[str, float]:
        samples = scrape(scaled.base)
        key = 'trickle_cold_start_seconds_{}{{model="demo",phase="{}"}}'
        if samples.get(key.format("count", "total"), 0) < 1:
            return {}
        phases = ("total", "model_load", "rest")
        return {phase: samples[key.format("sum", phase)] for phase in phases}

    cold = wait_for(cold_start, 10, "the cold start metric", interval=0.5)
    print(
        f"first job TTFT {ttft:.2f} s; cold start {cold['total']:.2f} s "
        f"(model load {cold['model_load']:.2f} s, the rest {cold['rest']:.2f} s)"
    )
    assert cold["model_load"] > 0 and cold["rest"] > 0
    assert cold["total"] == pytest.approx(cold["model_load"] + cold["rest"])
    assert ttft <= cold["total"] + 1.0


def test_an_idle_pool_goes_back_to_zero(scaled: UpStack) -> None:
    job = submit(scaled.base, {"prompt": "The", "max_tokens": 20}, wait=30)
    assert job["status"] == "succeeded"
    wait_for(lambda: live_workers(scaled.base) == 0, IDLE_SECONDS + 5, "zero workers", 0.2)
    print(f"back to zero {time.time() - job['completed_at']:.2f} s after the last job")
    assert "idle for 5 s, stopping it" in scaled.log()


def test_a_burst_of_50_long_jobs_brings_two_workers_within_5s(scaled: UpStack) -> None:
    assert live_workers(scaled.base) == 0
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        jobs = list(pool.map(lambda _: submit(scaled.base, LONG), range(50)))
    wait_for(lambda: live_workers(scaled.base) == 2, 5 - (time.monotonic() - started), "2 workers")
    print(f"2 workers up {time.monotonic() - started:.2f} s after the burst began")
    busy = 'trickle_worker_slots{model="demo",state="busy"}'
    # Busy slots travel with the next heartbeat after a claim (every 0.5 s here).
    samples = wait_for(lambda: (s := scrape(scaled.base)).get(busy, 0) > 0 and s, 10, busy)
    assert samples['trickle_workers{model="demo"}'] == 2
    assert samples['trickle_queue_depth{model="demo"}'] > 0
    assert samples['trickle_oldest_queued_seconds{model="demo"}'] > 0
    for job in jobs:
        requests.post(f"{scaled.base}/v1/jobs/{job['id']}/cancel", timeout=10)
