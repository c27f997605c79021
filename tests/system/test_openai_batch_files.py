"""OpenAI's Files + Batch flow, driven by the official ``openai`` client against the real stack
(gunicorn + gevent, the batch consumer, Celery worker, CTranslate2): upload, create, poll, read
the output file. The ``both_models`` tests send ``served_model`` (demo, or SmolLM2 under `make
test-real-model`)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest
import requests

from ops.redis_server import free_port
from tests import stack
from trickle.config.settings import PROJECT_ROOT


def chat_line(custom_id: str, model: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Hello"}]
    body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(lines: list[dict[str, Any] | str]) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def until_final(client: openai.OpenAI, batch_id: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        batch = client.batches.retrieve(batch_id)
        seen.append(batch.status)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch, seen
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)


@pytest.fixture
def client(stack_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack_url}/v1", api_key="-", max_retries=0)


@pytest.mark.both_models
def test_the_openai_client_runs_a_batch_from_a_file(
    client: openai.OpenAI, stack_url: str, served_model: str
) -> None:
    lines: list[dict[str, Any] | str] = [
        chat_line("first", served_model),
        "{not json",
        chat_line("second", served_model, max_tokens=4),
        chat_line("too-long", served_model, max_tokens=10**6),
        chat_line("third", served_model, n=2),
    ]
    uploaded = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    assert uploaded.id.startswith("file-") and uploaded.purpose == "batch"
    assert uploaded.bytes == len(jsonl(lines)) and uploaded.filename == "requests.jsonl"
    assert client.files.content(uploaded.id).content == jsonl(lines)
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "system-test"},
    )
    assert batch.status == "validating"  # answered at once: the batch consumer reads it
    assert batch.input_file_id == uploaded.id and batch.metadata == {"run": "system-test"}
    done, seen = until_final(client, batch.id)
    assert done.status == "completed", (done, seen)
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (5, 3)
    assert done.request_counts.failed == 2
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert done.output_file_id and done.error_file_id
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in output] == ["first", "second", "third"]
    for result in output:
        assert result["error"] is None and result["response"]["status_code"] == 200
        body = result["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == served_model
        # Each request's job is an ordinary job: its stored output is the answer's text.
        job = requests.get(f"{stack_url}/v1/jobs/{result['response']['request_id']}", timeout=10)
        assert job.json()["output"] == body["choices"][0]["message"]["content"]
    assert len(output[2]["response"]["body"]["choices"]) == 2
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert [x["custom_id"] for x in errors] == [None, "too-long"]
    assert errors[1]["response"]["body"]["error"]["param"] == "max_tokens"
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert batch.id in [b.id for b in client.batches.list(limit=100)]
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )


@pytest.mark.both_models
def test_a_responses_batch_answers_response_objects(
    client: openai.OpenAI, served_model: str
) -> None:
    lines: list[dict[str, Any] | str] = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": served_model, "input": "The socket", "max_output_tokens": 6},
        }
        for i in range(2)
    ]
    uploaded = client.files.create(file=("r.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h"
    )
    done, _seen = until_final(client, batch.id)
    assert done.status == "completed" and done.error_file_id is None
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    for result in output:
        body = result["response"]["body"]
        assert body["object"] == "response" and body["status"] in ("completed", "incomplete")
        assert body["model"] == served_model and body["output"][0]["content"][0]["text"]


@pytest.mark.both_models
def test_a_bad_endpoint_or_purpose_names_the_field(
    client: openai.OpenAI, served_model: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    assert refused.value.body["param"] == "purpose"  # type: ignore[index]
    uploaded = client.files.create(
        file=("x.jsonl", jsonl([chat_line("a", served_model)])), purpose="batch"
    )
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/embeddings",  # type: ignore[arg-type]
            completion_window="24h",
        )
    assert refused.value.body["param"] == "endpoint"  # type: ignore[index]


@pytest.fixture
def bulk_web(config_path: Path, log_dir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A web process of its own, with a model no worker serves: a 10,000-line batch's jobs
    wait in their own queue, out of every other test's way."""
    port = free_port()
    env = {"TRICKLE__MODELS__BULK__PATH": str(PROJECT_ROOT / "models" / "demo")}
    process = stack.start_web(config_path, port, log_dir, env, name="web-bulk")
    yield f"http://127.0.0.1:{port}", process
    stack.stop(process)


@pytest.mark.timeout(120)
def test_an_upload_and_a_download_are_never_held_whole(
    bulk_web: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, process = bulk_web
    (worker,) = psutil.Process(process.pid).children()
    data = bytes(range(256)) * (48 * 2**20 // 256)  # 48 MiB
    requests.get(f"{url}/v1/files", timeout=10)  # the process has served a request first
    before = worker.memory_info().rss
    uploaded = requests.post(
        f"{url}/v1/files", files={"file": ("big.bin", data)}, data={"purpose": "user_data"},
        timeout=120,
    )  # fmt: skip
    assert uploaded.status_code == 200, uploaded.text
    file_id = uploaded.json()["id"]
    after_upload = worker.memory_info().rss - before
    with requests.get(f"{url}/v1/files/{file_id}/content", stream=True, timeout=120) as got:
        received = b"".join(got.iter_content(2**20))
    after_download = worker.memory_info().rss - before
    requests.delete(f"{url}/v1/files/{file_id}", timeout=30)
    print(
        f"48 MiB file: the web process grew {after_upload / 2**20:.1f} MiB on upload, "
        f"{after_download / 2**20:.1f} MiB after the download"
    )
    assert received == data
    assert after_upload < 16 * 2**20 and after_download < 16 * 2**20
