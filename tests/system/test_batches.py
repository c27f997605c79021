"""OpenAI Batch API on the real stack: JSONL in, jobs at batch priority, JSONL out. The
``both_models`` tests send ``served_model`` (demo, or SmolLM2 under `make test-real-model`)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests import stack
from tests.clients import batch_read_in, poll_until_finished, submit


def jsonl(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


def completion(custom_id: str, **body: Any) -> dict[str, Any]:
    body = {"model": "demo", "prompt": "The", "max_tokens": 8, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


def chat(custom_id: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Hello"}]
    body = {"model": "demo", "messages": messages, "max_tokens": 8, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def wait_until_done(base: str, batch_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        batch = requests.get(f"{base}/v1/batches/{batch_id}", timeout=10).json()
        if batch["status"] in ("completed", "cancelled", "failed"):
            return batch  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)


@pytest.mark.both_models
def test_jsonl_batch_runs_and_returns_openai_output(stack_url: str, served_model: str) -> None:
    lines = [
        completion("c-1", model=served_model),
        completion("c-2", prompt=["A", "B"], n=2, model=served_model),
        chat("chat-1", model=served_model),
        completion("too-long", max_tokens=10**6, model=served_model),
        chat("chat-2", temperature=0, model=served_model),
    ]
    created = requests.post(
        f"{stack_url}/v1/batches",
        data=jsonl(lines),
        headers={"Content-Type": "application/jsonl"},
        timeout=30,
    )
    assert created.status_code == 200, created.text
    batch = created.json()
    assert batch["object"] == "batch" and batch["status"] == "validating"
    done = wait_until_done(stack_url, batch["id"], timeout=180)
    assert done["status"] == "completed" and done["endpoint"] == "mixed"
    assert done["request_counts"] == {"total": 5, "completed": 4, "failed": 1}
    output = requests.get(f"{stack_url}/v1/batches/{batch['id']}/output", timeout=30)
    assert output.headers["Content-Type"].startswith("application/jsonl")
    results = [json.loads(line) for line in output.text.splitlines()]
    assert [r["custom_id"] for r in results] == ["c-1", "c-2", "chat-1", "too-long", "chat-2"]
    by_id = {r["custom_id"]: r for r in results}
    assert by_id["c-1"]["response"]["status_code"] == 200
    assert by_id["c-1"]["response"]["body"]["object"] == "text_completion"
    assert len(by_id["c-2"]["response"]["body"]["choices"]) == 4
    assert by_id["chat-1"]["response"]["body"]["choices"][0]["message"]["role"] == "assistant"
    refused = by_id["too-long"]
    assert refused["response"]["status_code"] == 400
    assert refused["response"]["body"]["error"]["param"] == "max_tokens"
    # Each request's jobs are ordinary jobs, visible through the job API.
    job_id = by_id["chat-2"]["response"]["request_id"]
    job = requests.get(f"{stack_url}/v1/jobs/{job_id}", timeout=10).json()
    assert job["output"] == by_id["chat-2"]["response"]["body"]["choices"][0]["message"]["content"]


@pytest.mark.both_models
def test_uploaded_file_is_accepted(stack_url: str, served_model: str) -> None:
    lines = [completion("one", model=served_model), chat("two", model=served_model)]
    files = {"file": ("requests.jsonl", jsonl(lines), "application/jsonl")}
    created = requests.post(f"{stack_url}/v1/batches", files=files, timeout=30)
    assert created.status_code == 200, created.text
    done = wait_until_done(stack_url, created.json()["id"], timeout=120)
    assert done["request_counts"]["completed"] == 2


def test_input_that_cannot_be_a_batch_is_refused_naming_why(stack_url: str) -> None:
    for body, param in (
        ("{not json\n" + jsonl([completion("a")]), "line 1"),
        (jsonl([{**completion("a"), "url": "/v1/embeddings"}]), "line 1.url"),
        ("", "input"),
        (b"\xff\xfe\n", "input"),
    ):
        response = requests.post(f"{stack_url}/v1/batches", data=body, timeout=10)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


def test_bad_lines_fail_alone_in_the_error_file(stack_url: str) -> None:
    body = (
        jsonl([completion("a", max_tokens=1)])
        + "{not json\n"
        + jsonl([completion("a"), {**completion("b"), "url": "/v1/embeddings"}])
    )
    created = requests.post(f"{stack_url}/v1/batches", data=body, timeout=10)
    assert created.status_code == 200, created.text
    done = wait_until_done(stack_url, created.json()["id"], timeout=120)
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    errors = requests.get(f"{stack_url}/v1/files/{done['error_file_id']}/content", timeout=10)
    params = [json.loads(x)["response"]["body"]["error"]["param"] for x in errors.text.splitlines()]
    assert params == ["line 2", "line 3.custom_id", "line 4.url"]


def test_cancel_stops_queued_requests(stack_url: str) -> None:
    lines = [completion(f"late-{i}", model="late", max_tokens=50) for i in range(5)]
    batch = requests.post(f"{stack_url}/v1/batches", data=jsonl(lines), timeout=30).json()
    batch_read_in(stack_url, batch["id"])  # its jobs queued (a batch cancelled sooner reads none)
    cancelled = requests.post(f"{stack_url}/v1/batches/{batch['id']}/cancel", timeout=30).json()
    assert cancelled["status"] in ("cancelling", "cancelled")
    done = wait_until_done(stack_url, batch["id"])
    assert done["status"] == "cancelled"
    assert done["request_counts"]["failed"] == 5
    output = requests.get(f"{stack_url}/v1/batches/{batch['id']}/output", timeout=30).text
    assert {json.loads(line)["error"]["code"] for line in output.splitlines()} == {
        "batch_cancelled"
    }


@pytest.mark.timeout(180)
def test_batch_work_does_not_delay_interactive_jobs(
    stack_url: str, config_path: Path, redis_url: str, log_dir: Path
) -> None:
    # A backlog of batch requests waits on `late`, then one interactive job arrives.
    lines = [
        completion(f"bulk-{i}", model="late", max_tokens=300, ignore_eos=True) for i in range(30)
    ]
    batch = requests.post(f"{stack_url}/v1/batches", data=jsonl(lines), timeout=30).json()
    batch_read_in(stack_url, batch["id"])  # the backlog queued first
    interactive = submit(stack_url, {"prompt": "Now", "model": "late", "max_tokens": 20})
    worker: subprocess.Popen[bytes] = stack.start_worker(
        config_path, redis_url, "priority", log_dir, models=("late",),
        extra_env={"TRICKLE__MODELS__LATE__MAX_BATCH_SIZE": "2"},
    )  # fmt: skip
    try:
        first = poll_until_finished(stack_url, interactive["id"], timeout=60)
        wait_until_done(stack_url, batch["id"], timeout=120)
    finally:
        stack.stop(worker)
    output = requests.get(f"{stack_url}/v1/batches/{batch['id']}/output", timeout=30).text
    finished_at = sorted(
        requests.get(
            f"{stack_url}/v1/jobs/{json.loads(line)['response']['request_id']}", timeout=10
        ).json()["completed_at"]
        for line in output.splitlines()
    )
    # The interactive job overtook the batch backlog queued before it.
    assert first["completed_at"] < finished_at[len(finished_at) // 2]
