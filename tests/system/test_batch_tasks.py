"""Batch work as Celery tasks in the batch consumer, never in a web process: the web tier's
/healthz stays fast through a large batch's whole life, and a batch whose ingest process and
web process are both killed mid-reading still completes, exact, with no web process at all."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest
import redis
import requests

from tests.clients import jsonl
from tests.faultstack import FaultStack, wait_for
from tests.stack import ACCESS_LOG
from trickle import keys

FINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def batch_stack(
    tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path
) -> Iterator[FaultStack]:
    """Web, batch consumer and one demo worker, each in a process group of its own (a kill
    takes the whole tree, as a container's end would)."""

    def config(redis_url: str) -> str:
        return (
            f'default_model = "demo"\n[redis]\nurl = "{redis_url}"\n'
            "[files]\nbatch_sweep_seconds = 0.5\n"
            # Jobs recorded whose messages died with the killed consumer are sent again soon.
            "[worker]\nrepublish_after_seconds = 3.0\n"
            f'[models.demo]\npath = "{demo_model_dir}"\n'
        )

    stack = FaultStack(
        tmp_path_factory.mktemp("batch-tasks"), config, own_groups=True, config_name="batch.toml"
    )
    try:
        stack.start_web(ACCESS_LOG)
        stack.start_batch()
        stack.worker("batch-demo", ("demo",))
    except Exception:
        stack.close()
        raise
    yield stack
    stack.close()


def chat_line(custom_id: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Hello"}]
    body = {"model": "demo", "messages": messages, "max_tokens": 1, "temperature": 0, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def openai_client(stack: FaultStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.web_url}/v1", api_key="-", max_retries=0, timeout=60)


def create(client: openai.OpenAI, lines: list[dict[str, Any]], name: str) -> Any:
    uploaded = client.files.create(file=(name, jsonl(lines)), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def file_lines(store: redis.Redis, file_id: str) -> list[dict[str, Any]]:
    """A stored file's JSONL lines, read from Redis itself (no web process needed)."""
    data = b"".join(store.lrange(keys.file_chunks(file_id), 0, -1))
    return [json.loads(x) for x in data.splitlines()]


def create_from_body(stack: FaultStack, lines: list[dict[str, Any]]) -> Any:
    """A batch of JSONL in the body (Trickle's extension), as the OpenAI client's object."""
    answer = requests.post(
        f"{stack.web_url}/v1/batches",
        data=jsonl(lines),
        headers={"Content-Type": "application/jsonl"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return openai.types.Batch.model_validate(answer.json())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("way", ["file", "body"])
def test_healthz_answers_through_a_large_batchs_life(batch_stack: FaultStack, way: str) -> None:
    count = 3000
    client = openai_client(batch_stack)
    health = f"{batch_stack.web_url}/healthz"
    waits: list[float] = []
    lines = [chat_line(f"h{i}") for i in range(count)]
    with requests.Session() as session:
        session.get(health, timeout=10).raise_for_status()  # connected, warm
        started = time.monotonic()
        if way == "file":
            batch = create(client, lines, "health.jsonl")
        else:
            batch = create_from_body(batch_stack, lines)
        answered = time.monotonic() - started
        assert batch.status == "validating", batch  # answered at once: the consumer reads it
        seen = {batch.status}
        polled = time.monotonic()
        deadline = polled + 240
        while batch.status not in FINAL:
            asked = time.perf_counter()
            session.get(health, timeout=10).raise_for_status()
            waits.append(time.perf_counter() - asked)
            if time.monotonic() - polled > 1:  # the batch's progress, now and then
                batch, polled = client.batches.retrieve(batch.id), time.monotonic()
                seen.add(batch.status)
            assert time.monotonic() < deadline, batch
            time.sleep(0.02)
    ranked = sorted(waits)
    print(
        f"{count} lines ({way}): created in {answered * 1000:.0f} ms, stages {sorted(seen)}; "
        f"/healthz {len(waits)} answers, p50 {ranked[len(ranked) // 2] * 1000:.1f} ms, p99 "
        f"{ranked[len(ranked) * 99 // 100] * 1000:.1f} ms, slowest {ranked[-1] * 1000:.1f} ms, "
        f"{sum(w >= 0.05 for w in waits)} at 50 ms or more"
    )
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed) == (count, count)
    assert "in_progress" in seen and len(waits) >= 50
    # No freeze: the ingest in the request once held /healthz for seconds. The 50 ms goal is a
    # figure (printed above, and in docs/performance.md), not a timed assertion: on two shared
    # cores a scheduler hiccup alone passes it (84.5 ms slowest at load 6).
    assert max(waits) < 1.0


def assert_completed_exactly(
    store: redis.Redis, binary: redis.Redis, batch_id: str, custom_ids: list[str]
) -> list[dict[str, Any]]:
    """The batch completed with every line once: counts, items in input order, one job each,
    an output line per input line, all answered 200, no error file. Returns the output lines."""
    record = store.hgetall(keys.batch(batch_id))
    assert record["stage"] == "completed", record
    count = len(custom_ids)
    assert (int(record["total"]), json.loads(record["completed"])) == (count, count)
    assert json.loads(record["failed"]) == 0
    assert json.loads(record.get("error_file_id", "null")) is None
    items = [json.loads(x) for x in store.lrange(keys.batch_items(batch_id), 0, -1)]
    assert [item["custom_id"] for item in items] == custom_ids
    assert len({job_id for item in items for job_id in item["job_ids"]}) == count
    output: list[dict[str, Any]] = file_lines(binary, json.loads(record["output_file_id"]))
    assert sorted(x["custom_id"] for x in output) == sorted(custom_ids)
    assert len(output) == count
    assert {x["response"]["status_code"] for x in output} == {200}
    return output


@pytest.mark.timeout(300)
def test_a_batch_completes_exactly_with_its_ingest_and_web_processes_killed(
    batch_stack: FaultStack,
) -> None:
    count = 5000
    client = openai_client(batch_stack)
    batch = create(client, [chat_line(f"k{i}") for i in range(count)], "kill.jsonl")
    assert batch.status == "validating"
    store = batch_stack.client()
    binary = redis.Redis.from_url(batch_stack.redis_url)
    try:
        assert batch_stack.web_process is not None and batch_stack.batch_process is not None
        batch_stack.kill(batch_stack.web_process)  # no web process from here on
        batch_stack.web_process = None

        def mid_reading() -> bool:
            total = int(store.hget(keys.batch(batch.id), "total") or 0)
            assert total < count, "the reading ended before the kill"
            return total >= 400

        wait_for(mid_reading, 60, "part of the input read", interval=0.005)
        batch_stack.kill(batch_stack.batch_process)  # SIGKILL mid-reading, its lease held
        read_then = int(store.hget(keys.batch(batch.id), "total") or 0)
        print(f"the batch consumer killed with {read_then} of {count} lines read")
        batch_stack.start_batch()  # as `trickle up` restarts it
        wait_for(
            lambda: store.hget(keys.batch(batch.id), "stage") in FINAL,
            240,
            "the batch to end with no web process",
            interval=0.2,
        )
        output = assert_completed_exactly(store, binary, batch.id, [f"k{i}" for i in range(count)])
        assert all(x["error"] is None for x in output)
    finally:
        store.close()
        binary.close()
        if batch_stack.web_process is None:
            batch_stack.start_web(ACCESS_LOG)


@pytest.mark.timeout(300)
def test_a_jsonl_body_batch_completes_exactly_with_its_web_process_killed_after_the_answer(
    batch_stack: FaultStack,
) -> None:
    count = 2000
    batch = create_from_body(batch_stack, [chat_line(f"j{i}") for i in range(count)])
    assert batch.status == "validating"  # answered before any line became a job
    assert batch_stack.web_process is not None
    batch_stack.kill(batch_stack.web_process)  # SIGKILL right after the answer
    batch_stack.web_process = None
    store = batch_stack.client()
    binary = redis.Redis.from_url(batch_stack.redis_url)
    try:
        wait_for(
            lambda: store.hget(keys.batch(batch.id), "stage") in FINAL,
            240,
            "the batch to end with no web process",
            interval=0.2,
        )
        output = assert_completed_exactly(store, binary, batch.id, [f"j{i}" for i in range(count)])
        assert [x["custom_id"] for x in output] == [f"j{i}" for i in range(count)]
    finally:
        store.close()
        binary.close()
        if batch_stack.web_process is None:
            batch_stack.start_web(ACCESS_LOG)


@pytest.mark.timeout(180)
def test_one_huge_batch_line_fails_alone_and_freezes_nothing(batch_stack: FaultStack) -> None:
    """The probe: one 32 MiB line stalled /healthz 2.7-3.1 s and grew the web process by
    1.2 GiB (read whole, its prompt tokenized whole). A line is a body now: past
    ``web.max_body_bytes`` it fails alone with 413, read cut at that size, by the batch
    consumer; the web process only counts the lines."""
    client = openai_client(batch_stack)
    huge = chat_line("huge", messages=[{"role": "user", "content": "word " * 2**23}])
    data = jsonl([chat_line("small"), huge])
    assert len(data) > 32 * 2**20
    uploaded = client.files.create(file=("huge.jsonl", data), purpose="batch")
    assert batch_stack.batch_process is not None
    consumer = psutil.Process(batch_stack.batch_process.pid)
    before = consumer.memory_info().rss
    health = f"{batch_stack.web_url}/healthz"
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    waits = []
    while batch.status not in FINAL:
        asked = time.perf_counter()
        assert requests.get(health, timeout=10).ok
        waits.append(time.perf_counter() - asked)
        batch = client.batches.retrieve(batch.id)
        time.sleep(0.05)
    grew = consumer.memory_info().rss - before
    try:
        assert batch.status == "completed", batch
        assert batch.request_counts.total == 2 and batch.request_counts.failed == 1, batch
        assert batch.error_file_id is not None
        text = client.files.content(batch.error_file_id).text
        (error,) = [json.loads(x) for x in text.splitlines()]
        assert error["custom_id"] is None and error["response"]["status_code"] == 413
        print(f"one 40 MiB line: /healthz slowest {max(waits) * 1000:.0f} ms, "
              f"the batch consumer grew {grew >> 20} MiB")  # fmt: skip
        assert max(waits) < 0.25 and grew < 64 * 2**20  # a 40 MiB file counted in the POST
    finally:
        client.files.delete(uploaded.id)
