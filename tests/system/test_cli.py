"""The `trickle` command line client against the real stack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from ops.redis_server import free_port, port_in_use
from tests.clients import get_job
from tests.faultstack import wait_for

TRICKLE = str(Path(sys.executable).parent / "trickle")


def run(stack_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRICKLE_URL": stack_url}
    return subprocess.run([TRICKLE, *args], capture_output=True, text=True, env=env, timeout=120)


def test_generate_streams_and_reports_ttft(stack_url: str) -> None:
    # The demo model ends its answers (greedy ones within about 40 tokens): --ignore-eos runs
    # this one to its 40, the count the summary must report.
    args = ("generate", "The socket", "--max-tokens", "40", "--ignore-eos", "--stream")
    result = run(stack_url, *args)
    assert result.returncode == 0, result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    job_id = summary.split(" ")[0]
    assert "TTFT" in summary and "tokens/s" in summary and "40 tokens" in summary
    assert result.stdout == get_job(stack_url, job_id)["output"] + "\n"


def test_generate_without_streaming_and_jobs_get(stack_url: str) -> None:
    result = run(stack_url, "generate", "Return the", "--max-tokens", "12", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    job_id = result.stderr.split(" ")[0]
    shown = run(stack_url, "jobs", "get", job_id)
    assert shown.returncode == 0
    job = json.loads(shown.stdout)
    assert job["id"] == job_id and result.stdout == job["output"] + "\n"


def test_api_errors_are_reported_not_raised(stack_url: str) -> None:
    result = run(stack_url, "generate", "x", "--model", "nope")
    assert result.returncode == 2
    assert "HTTP 404" in result.stderr and "model" in result.stderr
    missing = run(stack_url, "jobs", "get", "job_missing")
    assert missing.returncode == 2 and "HTTP 404" in missing.stderr


def test_batch_submit_waits_with_progress_and_writes_output(stack_url: str, tmp_path: Path) -> None:
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "demo", "prompt": "The", "max_tokens": 5},
        }
        for i in range(6)
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    target = tmp_path / "out.jsonl"
    result = run(stack_url, "batch", "submit", str(source), "--wait", "--output", str(target))
    assert result.returncode == 0, result.stderr
    assert "6/6" in result.stderr and "completed" in result.stderr
    outputs = [json.loads(line) for line in target.read_text().splitlines()]
    assert [o["custom_id"] for o in outputs] == [f"r{i}" for i in range(6)]
    assert all(o["response"]["status_code"] == 200 for o in outputs)


@pytest.mark.timeout(120)
def test_up_runs_the_procfile_and_stops_everything_on_sigterm(config_path: Path) -> None:
    """`trickle up` (what `make up` runs): embedded Redis, then honcho with the Procfile."""
    redis_port, web_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRICKLE")}
    env.update(
        TRICKLE_CONFIG=str(config_path),
        TRICKLE__REDIS__URL=f"redis://127.0.0.1:{redis_port}/0",
        TRICKLE_PORT=str(web_port),
        TRICKLE_MODELS="demo",
    )
    up = subprocess.Popen(
        [TRICKLE, "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{web_port}"
    try:

        def ready() -> bool:
            try:
                return requests.get(f"{base}/readyz", timeout=5).status_code == 200
            except requests.RequestException:
                return False

        wait_for(lambda: ready() or up.poll() is not None, 90, "trickle up to serve")
        assert up.poll() is None, "trickle up exited early"
        job = requests.post(
            f"{base}/v1/jobs",
            json={"prompt": "The", "max_tokens": 8, "ignore_eos": True},
            headers={"Prefer": "wait=30"},
            timeout=40,
        ).json()
        assert job["status"] == "succeeded" and job["usage"]["completion_tokens"] == 8
        # The Procfile's batch line runs too: a file batch is read and settled by it.
        line = {"custom_id": "a", "method": "POST", "url": "/v1/completions",
                "body": {"model": "demo", "prompt": "The", "max_tokens": 2}}  # fmt: skip
        files = {"file": ("in.jsonl", json.dumps(line).encode() + b"\n")}
        uploaded = requests.post(f"{base}/v1/files", data={"purpose": "batch"}, files=files,
                                 timeout=30).json()  # fmt: skip
        batch = requests.post(f"{base}/v1/batches", timeout=30, json={
            "input_file_id": uploaded["id"], "endpoint": "/v1/completions",
            "completion_window": "24h"}).json()  # fmt: skip

        def completed() -> dict[str, Any] | None:
            found = requests.get(f"{base}/v1/batches/{batch['id']}", timeout=10).json()
            return found if found["status"] == "completed" else None

        done = wait_for(completed, 60, "the batch consumer to complete a batch", interval=0.2)
        assert done["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            output, _ = up.communicate(timeout=45)
        except subprocess.TimeoutExpired:
            up.kill()
            output, _ = up.communicate()
    assert up.returncode == 0, output
    assert f"embedded Redis on 127.0.0.1:{redis_port}" in output
    assert "batch.1 started" in output
    assert not port_in_use(redis_port) and not port_in_use(web_port)  # nothing outlives it
