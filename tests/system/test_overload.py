"""Overload: a burst beyond a model's queue bound gets 429s, never a 5xx, and loses nothing."""

from __future__ import annotations

import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from tests import stack
from tests.clients import poll_until_finished

BURST = 500


def test_burst_of_submissions_is_bounded_and_every_accepted_job_completes(
    stack_url: str, config_path: Path, redis_url: str, log_dir: Path
) -> None:
    session = requests.Session()

    def post(i: int) -> requests.Response:
        body = {"prompt": f"Burst {i}", "model": "late", "max_tokens": 4, "ignore_eos": True}
        return session.post(f"{stack_url}/v1/jobs", json=body, timeout=60)

    with ThreadPoolExecutor(max_workers=16) as pool:
        responses = list(pool.map(post, range(BURST)))
    statuses = Counter(response.status_code for response in responses)
    assert set(statuses) <= {202, 429}, statuses  # zero 5xx
    assert statuses[429] > 0
    accepted = [r.json()["id"] for r in responses if r.status_code == 202]
    assert 0 < len(accepted) <= 100 + 16  # the bound (checked before enqueueing, per request)
    refused = next(r for r in responses if r.status_code == 429)
    assert int(refused.headers["Retry-After"]) > 0
    assert refused.json()["error"]["code"] == "queue_full"
    drainer: subprocess.Popen[bytes] = stack.start_worker(
        config_path, redis_url, "burst", log_dir, models=("late",)
    )
    try:
        finished = [poll_until_finished(stack_url, job_id, timeout=120) for job_id in accepted]
    finally:
        stack.stop(drainer)
    assert Counter(job["status"] for job in finished) == {"succeeded": len(accepted)}
