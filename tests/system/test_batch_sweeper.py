"""The batch sweep in the real batch consumer (Celery beat in it, the tasks on the batch queue):
a file batch's output file is written and listed, and the batch completed, while nobody reads
the batch."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis

from tests.faultstack import FaultStack, build_fault_stack, wait_for
from trickle import keys


@pytest.fixture(scope="module")
def sweep_stack(
    tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path
) -> Iterator[FaultStack]:
    stack = build_fault_stack(
        tmp_path_factory.mktemp("sweep"),
        models_toml=f'[models.demo]\npath = "{demo_model_dir}"\n',
        settings_toml="[files]\nbatch_sweep_seconds = 0.5\n",
    )
    stack.worker("sweep", ("demo",))
    yield stack
    stack.close()


def test_a_batch_nobody_reads_gets_its_output_file(sweep_stack: FaultStack) -> None:
    client = openai.OpenAI(base_url=f"{sweep_stack.web_url}/v1", api_key="-", max_retries=0)
    lines = [
        {
            "custom_id": name,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "demo",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
            },
        }
        for name in ("a", "b")
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    name = f"{batch.id}_output.jsonl"
    # Files are listed, the batch is never read: only the sweep's task can have written this one.
    output = wait_for(
        lambda: next((f for f in client.files.list() if f.filename == name), None),
        60,
        "the sweep to write the output file",
    )
    store = redis.Redis(port=sweep_stack.redis_port, decode_responses=True)
    assert store.hget(keys.batch(batch.id), "stage") == "completed"
    assert store.zscore(keys.batches_unsettled(), batch.id) is None
    found = client.batches.retrieve(batch.id)
    assert found.status == "completed" and found.output_file_id == output.id
    text = client.files.content(output.id).text
    assert [json.loads(x)["custom_id"] for x in text.splitlines()] == ["a", "b"]
    batch_log = (sweep_stack.log_dir / "batch.log").read_text("utf-8", "replace")
    assert f"batch {batch.id}: completed" in batch_log and "Traceback" not in batch_log
