"""Operators' doors: Prometheus metrics, structured job logs, and workers sharing a queue."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from tests import stack
from tests.clients import poll_until_finished, submit
from tests.faultstack import wait_for
from tests.metrics_text import scrape
from trickle import keys
from trickle.config.settings import load_settings
from trickle.queue import make_celery
from trickle.telemetry.metric_defs import JOBS
from trickle.telemetry.metrics import count_now, label_string


def test_metrics_cover_queue_jobs_latency_and_batches(stack_url: str) -> None:
    jobs = [
        submit(stack_url, {"prompt": "The", "max_tokens": 30, "ignore_eos": True}) for _ in range(6)
    ]
    for job in jobs:
        poll_until_finished(stack_url, job["id"])
    deadline = time.monotonic() + 10
    while True:  # workers flush their metrics every 2 s
        samples = scrape(stack_url)
        done = samples.get('trickle_jobs_total{model="demo",status="succeeded"}', 0)
        if done >= 6 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert done >= 6
    assert samples['trickle_workers{model="demo"}'] >= 1
    assert 'trickle_queue_depth{model="late"}' in samples
    assert "trickle_running_jobs{}" in samples and "trickle_active_streams{}" in samples
    assert samples['trickle_tokens_generated_total{model="demo"}'] >= 6 * 30
    for histogram in (
        "trickle_time_to_first_token_seconds",
        "trickle_queue_time_seconds",
        "trickle_inter_token_latency_seconds",
        "trickle_e2e_request_latency_seconds",
        "trickle_batch_size",
    ):
        buckets = [
            value
            for key, value in samples.items()
            if key.startswith(f'{histogram}_bucket{{model="demo"')
        ]
        assert buckets == sorted(buckets), f"{histogram} buckets are not cumulative"
        count = samples[f'{histogram}_count{{model="demo"}}']
        assert buckets[-1] == count > 0


def test_every_job_event_is_one_json_log_line(stack_url: str, log_dir: Path) -> None:
    job = submit(stack_url, {"prompt": "The", "max_tokens": 12, "ignore_eos": True}, wait=30)

    def job_events() -> list[dict[str, Any]]:
        return [
            json.loads(line.split("INFO:trickle.jobs:", 1)[1])
            for line in (log_dir / "main.log").read_text().splitlines()
            if "INFO:trickle.jobs:" in line and job["id"] in line
        ]

    # The finished line is written just after the result is stored: wait for it.
    events = wait_for(
        lambda: (found := job_events()) and found[-1]["event"] == "finished" and found,
        10,
        "the finished log line",
    )
    assert [event["event"] for event in events] == ["claimed", "finished"]
    finished = events[-1]
    assert finished["model"] == "demo" and finished["status"] == "succeeded"
    assert finished["completion_tokens"] == 12
    assert finished["ttft_seconds"] > 0 and finished["e2e_seconds"] >= finished["ttft_seconds"]
    # Where the first token's wait went, hop by hop: the hops before it add up to its TTFT.
    before_first = ("queue_wait", "claim", "batch_wait", "first_step")
    hops = [finished[f"{hop}_seconds"] for hop in before_first]
    assert all(seconds >= 0 for seconds in hops)
    assert sum(hops) <= finished["ttft_seconds"] + 0.002
    assert finished["generate_seconds"] > 0
    assert events[0]["worker"].startswith("main@")


def wait_until_consuming(config_path: Path, names: tuple[str, ...]) -> None:
    """A worker heartbeats (``start_worker`` returns) before its consumer reads the queue: a
    burst sent then could all go to the worker started first. A worker answers Celery's ping
    only once its consumer runs."""
    settings = load_settings(environ={"TRICKLE_CONFIG": str(config_path)})
    app = make_celery(settings, settings.models)

    def answered() -> bool:
        nodes = {node for reply in app.control.ping(timeout=0.5) or [] for node in reply}
        return all(any(node.startswith(name + "@") for node in nodes) for name in names)

    wait_for(answered, 30, "every worker's consumer running")


@pytest.mark.timeout(120)
def test_two_workers_share_a_burst(
    stack_url: str, config_path: Path, redis_url: str, log_dir: Path
) -> None:
    workers: list[subprocess.Popen[bytes]] = [
        stack.start_worker(config_path, redis_url, name, log_dir, models=("late",))
        for name in ("share-a", "share-b")
    ]
    try:
        wait_until_consuming(config_path, ("share-a", "share-b"))
        body = {"prompt": "The", "model": "late", "max_tokens": 300, "ignore_eos": True}
        with ThreadPoolExecutor(8) as pool:
            jobs = list(pool.map(lambda _: submit(stack_url, body), range(32)))
        for job in jobs:
            assert poll_until_finished(stack_url, job["id"], timeout=120)["status"] == "succeeded"
    finally:
        for worker in workers:
            stack.stop(worker)
    ids = {job["id"] for job in jobs}
    for name in ("share-a", "share-b"):
        claimed = [
            line
            for line in (log_dir / f"{name}.log").read_text().splitlines()
            if '"event": "claimed"' in line and any(job_id in line for job_id in ids)
        ]
        assert claimed, f"{name} ran none of the burst"


def test_label_values_are_escaped_so_prometheus_can_read_them(
    stack_url: str, redis_client: redis.Redis
) -> None:
    # A model name with a quote, a backslash and a newline (an operator's choice, or a bug):
    # the hand-written exporter wrote it raw, which prometheus_client's parser rejects.
    odd = 'we"ird\\model\nname'
    count_now(redis_client, JOBS, model=odd, status="succeeded")
    try:
        samples = scrape(stack_url)
        assert samples[f'trickle_jobs_total{{model="{odd}",status="succeeded"}}'] >= 1
    finally:
        field = f"{JOBS.name}|{label_string({'model': odd, 'status': 'succeeded'})}"
        redis_client.hdel(keys.METRIC_COUNTERS, field)
