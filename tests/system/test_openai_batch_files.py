"""OpenAI's Files + Batch flow, driven by the official ``openai`` client against the real stack
(gunicorn + gevent, Celery worker, CTranslate2): upload, create, poll, read the output file."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest
import redis
import requests

from ops.redis_server import free_port
from tests import stack
from trickle import keys
from trickle.config.settings import PROJECT_ROOT


def chat_line(custom_id: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Hello"}]
    body = {"model": "demo", "messages": messages, "max_tokens": 8, "temperature": 0, **body}
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


def test_the_openai_client_runs_a_batch_from_a_file(client: openai.OpenAI, stack_url: str) -> None:
    lines: list[dict[str, Any] | str] = [
        chat_line("first"),
        "{not json",
        chat_line("second", max_tokens=4),
        chat_line("too-long", max_tokens=10**6),
        chat_line("third", n=2),
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
    assert batch.status in ("in_progress", "finalizing", "completed")
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
        assert body["object"] == "chat.completion"
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


def test_a_responses_batch_answers_response_objects(client: openai.OpenAI) -> None:
    lines: list[dict[str, Any] | str] = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": "demo", "input": "The socket", "max_output_tokens": 6},
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
        assert body["output"][0]["content"][0]["text"]


def test_a_bad_endpoint_or_purpose_names_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    assert refused.value.body["param"] == "purpose"  # type: ignore[index]
    uploaded = client.files.create(file=("x.jsonl", jsonl([chat_line("a")])), purpose="batch")
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


def create_batch_timing_healthz(
    client: openai.OpenAI, url: str, input_file_id: str, interval: float
) -> tuple[Any, list[float]]:
    """Create a chat batch from ``input_file_id`` while asking ``/healthz`` every ``interval``
    seconds: the batch, and how long each health check took meanwhile."""
    created: list[Any] = []
    creating = threading.Thread(
        target=lambda: created.append(
            client.batches.create(
                input_file_id=input_file_id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
        )
    )
    creating.start()
    waits = []
    while creating.is_alive():
        asked = time.monotonic()
        assert requests.get(f"{url}/healthz", timeout=30).ok
        waits.append(time.monotonic() - asked)
        time.sleep(interval)
    (batch,) = created
    return batch, waits


@pytest.mark.timeout(180)
def test_one_huge_batch_line_fails_alone_and_freezes_nothing(
    bulk_web: tuple[str, subprocess.Popen[bytes]],
) -> None:
    """The probe: one 32 MiB line stalled /healthz 2.7-3.1 s and grew the web process by
    1.2 GiB (read whole, its prompt tokenized whole). A line is a body now: past
    ``web.max_body_bytes`` it fails alone with 413, read cut at that size."""
    url, process = bulk_web
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=120)
    huge = chat_line("huge", model="bulk", messages=[{"role": "user", "content": "word " * 2**23}])
    data = jsonl([chat_line("small", model="bulk", max_tokens=1), huge])
    assert len(data) > 32 * 2**20
    uploaded = client.files.create(file=("huge.jsonl", data), purpose="batch")
    (worker,) = psutil.Process(process.pid).children()
    before = worker.memory_info().rss
    batch, waits = create_batch_timing_healthz(client, url, uploaded.id, interval=0.02)
    grew = worker.memory_info().rss - before
    try:
        assert batch.request_counts.total == 2 and batch.request_counts.failed == 1, batch
        print(
            f"one 40 MiB line: /healthz slowest {max(waits) * 1000:.0f} ms, grew {grew >> 20} MiB"
        )
        assert max(waits) < 1.0 and grew < 64 * 2**20
    finally:
        client.batches.cancel(batch.id)
        client.files.delete(uploaded.id)


@pytest.mark.timeout(300)
def test_a_10000_line_batch_leaves_the_web_process_answering(
    bulk_web: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, process = bulk_web
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=240)
    lines: list[dict[str, Any] | str] = [
        chat_line(f"line-{i}", model="bulk", max_tokens=1) for i in range(10_000)
    ]
    uploaded = client.files.create(file=("bulk.jsonl", jsonl(lines)), purpose="batch")
    (worker,) = psutil.Process(process.pid).children()  # the gevent worker serving requests
    before = worker.memory_info().rss
    started = time.monotonic()
    batch, waits = create_batch_timing_healthz(client, url, uploaded.id, interval=0.05)
    took = time.monotonic() - started
    grew = worker.memory_info().rss - before
    try:
        assert batch.request_counts.total == 10_000, batch
        print(
            f"10,000 lines in {took:.1f} s; /healthz meanwhile: {len(waits)} answers, "
            f"slowest {max(waits) * 1000:.0f} ms; the web process grew {grew / 2**20:.1f} MiB"
        )
        assert len(waits) >= 5
        assert max(waits) < 1.0  # the reading yields between groups of lines
        assert grew < 64 * 2**20
    finally:
        cancelled = client.batches.cancel(batch.id)
        assert cancelled.status in ("cancelling", "cancelled")


@pytest.mark.timeout(300)
def test_a_web_process_killed_while_reading_a_batch_loses_no_line_and_doubles_none(
    bulk_web: tuple[str, subprocess.Popen[bytes]], redis_client: redis.Redis
) -> None:
    url, process = bulk_web
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=240)
    count = 10_000
    lines: list[dict[str, Any] | str] = [
        chat_line(f"k{i}", model="bulk", max_tokens=1) for i in range(count)
    ]
    uploaded = client.files.create(file=("kill.jsonl", jsonl(lines)), purpose="batch")
    (worker,) = psutil.Process(process.pid).children()

    def create() -> None:
        with contextlib.suppress(openai.APIError):  # its process is killed under it
            client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )

    threading.Thread(target=create, daemon=True).start()
    deadline = time.monotonic() + 60
    while True:  # until part of the input is read
        listed = requests.get(f"{url}/v1/batches?limit=1", timeout=30).json()["data"]
        if listed and listed[0]["input_file_id"] == uploaded.id:
            batch = listed[0]
            if batch["request_counts"]["total"] >= 1000:
                break
        assert time.monotonic() < deadline, listed
        time.sleep(0.05)
    assert batch["status"] == "validating"
    worker.kill()  # SIGKILL mid-reading: gunicorn starts another worker
    print(f"killed with {batch['request_counts']['total']} of {count} lines read")
    deadline = time.monotonic() + 180
    while True:  # the next read after the reading's lease lapsed resumes it
        try:
            found = requests.get(f"{url}/v1/batches/{batch['id']}", timeout=120).json()
        except requests.RequestException:
            found = {"status": "restarting"}
        if found["status"] != "validating" and found["status"] != "restarting":
            break
        assert time.monotonic() < deadline, found
        time.sleep(1)
    try:
        assert found["status"] == "in_progress" and found["request_counts"]["total"] == count
        store = redis_client
        items = [json.loads(x) for x in store.lrange(keys.batch_items(batch["id"]), 0, -1)]
        assert [item["custom_id"] for item in items] == [f"k{i}" for i in range(count)]
        job_ids = [job_id for item in items for job_id in item["job_ids"]]
        assert len(set(job_ids)) == count
        pipe = store.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.exists(keys.job(job_id))
        assert all(pipe.execute())
    finally:
        client.batches.cancel(batch["id"])
