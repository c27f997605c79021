"""A JSONL-body batch over its key's limits is read as a file batch is: accepted at once, its
lines past the key's ``max_queued_jobs`` wait for room (never past the cap), and lines past its
``tokens_per_minute`` fail in the error file with the 429 naming the limit."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.faultstack import FaultStack, build_fault_stack, wait_for
from trickle import keys

QUEUED = "key-queued"
TOKENS = "key-tokens"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    """Two named keys with small limits and no worker: every job stays queued."""
    stack = build_fault_stack(
        tmp_path_factory.mktemp("batch-key-limits"),
        models_toml=f'[models.demo]\npath = "{demo_model_dir}"\n',
        settings_toml=(
            f'[keys.queued]\nkey = "{QUEUED}"\nmax_queued_jobs = 2\n'
            f'[keys.tokens]\nkey = "{TOKENS}"\ntokens_per_minute = 100\n'
        ),
    )
    yield stack
    stack.close()


def body_batch(base: str, key: str, lines: int, max_tokens: int) -> requests.Response:
    body = "".join(
        json.dumps({
            "custom_id": f"line-{index}", "method": "POST", "url": "/v1/completions",
            "body": {"model": "demo", "prompt": "The", "max_tokens": max_tokens},
        }) + "\n"
        for index in range(lines)
    )  # fmt: skip
    headers = {"Content-Type": "application/jsonl", **bearer(key)}
    return requests.post(f"{base}/v1/batches", data=body, headers=headers, timeout=30)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def batch_of(stack: FaultStack, key: str, batch_id: str) -> dict[str, Any]:
    url = f"{stack.web_url}/v1/batches/{batch_id}"
    found: dict[str, Any] = requests.get(url, headers=bearer(key), timeout=10).json()
    return found


def test_lines_past_the_keys_queue_cap_wait_for_room(limited: FaultStack) -> None:
    created = body_batch(limited.web_url, QUEUED, 3, 4)
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    try:
        # The reading pauses before the line whose job finds no room: two read, two queued.
        wait_for(
            lambda: batch_of(limited, QUEUED, batch_id)["request_counts"]["total"] == 2,
            30, "two lines read",
        )  # fmt: skip
        time.sleep(1.5)  # sweeps meanwhile resume the reading, which finds no room yet
        found = batch_of(limited, QUEUED, batch_id)
        assert found["status"] == "validating" and found["request_counts"]["total"] == 2, found
        with limited.client() as client:
            items = [json.loads(x) for x in client.lrange(keys.batch_items(batch_id), 0, -1)]
        assert [len(item["job_ids"]) for item in items] == [1, 1]
    finally:
        cancel = f"{limited.web_url}/v1/batches/{batch_id}/cancel"
        requests.post(cancel, headers=bearer(QUEUED), timeout=30)


def test_lines_past_the_keys_tokens_per_minute_fail_naming_it(limited: FaultStack) -> None:
    created = body_batch(limited.web_url, TOKENS, 2, 80)
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    done = wait_for(
        lambda: (found := batch_of(limited, TOKENS, batch_id))["status"] == "completed" and found,
        60, "the batch to end",
    )  # fmt: skip
    assert done["request_counts"] == {"total": 2, "completed": 0, "failed": 2}, done
    content = f"{limited.web_url}/v1/files/{done['error_file_id']}/content"
    errors = requests.get(content, headers=bearer(TOKENS), timeout=10)
    lines = [json.loads(x) for x in errors.text.splitlines()]
    assert {line["response"]["status_code"] for line in lines} == {429}
    for line in lines:
        error = line["response"]["body"]["error"]
        assert error["code"] == "rate_limit_exceeded" and "tokens_per_minute" in error["message"]
