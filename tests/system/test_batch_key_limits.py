"""A JSONL-body batch over its key's limits is a 429 naming the limit, and leaves nothing.

A body batch is created whole (unlike a file batch, whose lines wait for room): its jobs past
the key's ``max_queued_jobs``, or its tokens past ``tokens_per_minute``, refuse the request with
the limit named, and no batch, job or queue entry is left for the key or anyone else.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.faultstack import FaultStack, build_fault_stack
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
    headers = {"Content-Type": "application/jsonl", "Authorization": f"Bearer {key}"}
    return requests.post(f"{base}/v1/batches", data=body, headers=headers, timeout=30)


def stored(stack: FaultStack) -> dict[str, Any]:
    """Every key in Redis but the rate limiter's counters, the stream secret and the batch
    consumer's sweep turn (a lock its beat takes and lets expire, whatever the requests)."""
    with stack.client() as client:
        return {
            name: client.type(name)
            for name in client.scan_iter("*")
            if "ratelimit" not in name.lower()
            and "stream-secret" not in name
            and name != keys.batch_sweep()
        }


def settled(stack: FaultStack) -> dict[str, Any]:
    """``stored`` once the batch consumer has done with earlier requests (a batch made by the
    test before goes on in the background: its settle and sweep tasks write as they run)."""
    deadline = time.monotonic() + 20
    last = stored(stack)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = stored(stack)
        if now == last:
            return now
        last = now
    return last


@pytest.mark.parametrize(
    ("key", "lines", "max_tokens", "code", "limit"),
    [
        (QUEUED, 3, 4, "key_queue_full", "keys.queued.max_queued_jobs = 2"),
        (TOKENS, 2, 80, "rate_limit_exceeded", "tokens_per_minute"),
    ],
    ids=["max_queued_jobs", "tokens_per_minute"],
)
def test_a_body_batch_over_a_key_limit_is_429_naming_it(
    limited: FaultStack, key: str, lines: int, max_tokens: int, code: str, limit: str
) -> None:
    before = settled(limited)
    refused = body_batch(limited.web_url, key, lines, max_tokens)
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == code and limit in error["message"], error
    assert settled(limited) == before  # no batch, job or queue entry for anyone
    fits = body_batch(limited.web_url, key, 1, 4)  # within the limit: made
    assert fits.status_code == 200, fits.text
