"""A batch's output within its key's file storage, on a real stack (web, batch consumer,
worker, demo model): with a ``files.max_bytes_per_key`` that holds only a few lines' projected
output, the batch still completes, its lines waiting for room and running as others settle,
and at every poll the key's stored bytes (and stored plus held) stay within the quota; a line
whose projection alone passes the whole storage fails naming ``files.max_bytes_per_key``."""

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

QUOTA = 16_000
LINES = 12


@pytest.fixture(scope="module")
def small_storage(
    tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path
) -> Iterator[FaultStack]:
    stack = build_fault_stack(
        tmp_path_factory.mktemp("output-quota"),
        models_toml=f'[models.demo]\npath = "{demo_model_dir}"\n',
        settings_toml=f"[files]\nbatch_sweep_seconds = 0.5\nmax_bytes_per_key = {QUOTA}\n",
    )
    stack.worker("quota", ("demo",))
    yield stack
    stack.close()


def batch_line(custom_id: str, **body: Any) -> str:
    request = {"model": "demo", "messages": [{"role": "user", "content": "Hi"}], **body}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
         "body": request}
    )  # fmt: skip


def storage(stack: FaultStack, base: str) -> tuple[int, int]:
    """The key's stored bytes (its files, as listed) and what its quota counts (held too)."""
    files = requests.get(f"{base}/v1/files", timeout=10).json()["data"]
    client = stack.client()
    holders = client.zrangebyscore(keys.files_held(""), time.time(), "+inf")
    held = client.hmget(keys.files_held_bytes(""), holders) if holders else []
    return sum(found["bytes"] for found in files), sum(int(x) for x in held if x)


def test_a_batch_past_the_keys_storage_waits_for_room_and_completes(
    small_storage: FaultStack,
) -> None:
    base = small_storage.web_url
    huge = batch_line("huge", max_tokens=512, logprobs=True, top_logprobs=20)
    lines = [batch_line(f"line-{i}", max_tokens=16) for i in range(LINES)]
    data = "\n".join([huge, *lines]) + "\n"
    uploaded = requests.post(
        f"{base}/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"},
        timeout=30,
    ).json()  # fmt: skip
    body = {
        "input_file_id": uploaded["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    batch = requests.post(f"{base}/v1/batches", json=body, timeout=30).json()
    stored_seen, counted_seen, read_seen = [], [], []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = requests.get(f"{base}/v1/batches/{batch['id']}", timeout=10).json()
        stored, counted = storage(small_storage, base)
        stored_seen.append(stored)
        counted_seen.append(counted)
        if found["status"] == "validating":
            read_seen.append(found["request_counts"]["total"])
        if found["status"] in ("completed", "failed", "expired", "cancelled"):
            break
        time.sleep(0.2)
    assert found["status"] == "completed", found
    assert found["request_counts"] == {"total": LINES + 1, "completed": LINES, "failed": 1}
    assert max(stored_seen) <= QUOTA, stored_seen
    assert max(counted_seen) <= QUOTA, counted_seen
    # The reading paused with lines left to read: they waited for room, then ran.
    assert any(0 < total < LINES + 1 for total in read_seen), read_seen

    output = requests.get(f"{base}/v1/files/{found['output_file_id']}/content", timeout=10)
    answered = [json.loads(x) for x in output.text.splitlines()]
    assert [x["custom_id"] for x in answered] == [f"line-{i}" for i in range(LINES)]
    assert all(x["response"]["status_code"] == 200 for x in answered)
    errors = requests.get(f"{base}/v1/files/{found['error_file_id']}/content", timeout=10)
    (refused,) = [json.loads(x) for x in errors.text.splitlines()]
    error = refused["response"]["body"]["error"]
    assert refused["custom_id"] == "huge" and error["code"] == "output_exceeds_file_storage"
    assert f"files.max_bytes_per_key is {QUOTA}" in error["message"]
    final_stored, final_counted = storage(small_storage, base)
    assert final_stored <= final_counted <= QUOTA  # the batch holds nothing more
    batch_log = (small_storage.log_dir / "batch.log").read_text("utf-8", "replace")
    assert "Traceback" not in batch_log and "past its bound" not in batch_log
