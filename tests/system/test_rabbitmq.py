"""Celery on RabbitMQ: the whole stack with ``broker.url = amqp://…`` on a real rabbitmq-server.

The node is Debian's rabbitmq-server 3.10 started by the fixture (tests/rabbitmq.py); Redis,
the Celery workers, gunicorn and the models are the real ones, as everywhere else. Covered:
durable priority queues (``x-max-priority``), submit/stream/cancel, interactive work overtaking
queued batch work by message priority, a SIGKILLed worker's interactive and batch jobs resuming
elsewhere without a gap, and the 429 bound read from RabbitMQ's queue depth.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen

import pytest
import requests

from tests.clients import (
    assert_gapless,
    poll_until_finished,
    read_sse,
    stream_in_background,
    submit,
)
from tests.faultstack import (
    FaultStack,
    build_fault_stack,
    build_slow_model,
    tokens_streamed,
    wait_for,
)
from tests.metrics_text import parse_samples
from tests.rabbitmq import RabbitNode, rabbitmq_missing, start_rabbitmq
from trickle import keys

LEASE_SECONDS = 2.0
SWEEP_SECONDS = 0.5
QUEUE_LIMIT = 4
LONG = {"model": "slow", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}

# Each test starts and kills real processes (and the module a RabbitMQ node).
pytestmark = pytest.mark.timeout(180)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    missing = rabbitmq_missing()
    if missing is not None:
        if in_ci():
            pytest.fail(f"{missing} (CI must run the RabbitMQ tests)")
        pytest.skip(missing)
    node = start_rabbitmq(tmp_path_factory.mktemp("rabbitmq"))
    yield node
    node.stop()


@pytest.fixture(scope="module")
def mq(
    tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path, rabbit: RabbitNode
) -> Iterator[FaultStack]:
    root = tmp_path_factory.mktemp("rabbitmq-stack")
    slow = build_slow_model(root, demo_model_dir / "tokenizer.model")
    stack = build_fault_stack(
        root,
        models_toml=(
            f'[models.demo]\npath = "{demo_model_dir}"\nmax_batch_size = 4\n'
            f'[models.slow]\npath = "{slow}"\nmax_batch_size = 4\nintra_threads = 1\n'
            # One slot: a job waits for the one before it, so the order they ran is visible.
            f'[models.solo]\npath = "{slow}"\nmax_batch_size = 1\ninter_threads = 1\n'
            "intra_threads = 1\n"
            # No worker serves these: what is queued for them stays queued.
            f'[models.late]\npath = "{demo_model_dir}"\n'
            f'[models.parked]\npath = "{demo_model_dir}"\n'
        ),
        settings_toml=(
            f'[broker]\nurl = "{rabbit.url}"\n'
            f"[worker]\nlease_seconds = {LEASE_SECONDS}\n"
            f"recovery_interval_seconds = {SWEEP_SECONDS}\nheartbeat_seconds = 0.5\n"
            f"[limits]\nmax_tokens_ceiling = 2000\nmax_queued_jobs = {QUEUE_LIMIT}\n"
            "[web]\nkeepalive_seconds = 1.0\n"
        ),
    )
    yield stack
    stack.close()


@pytest.fixture(autouse=True)
def fresh_workers(mq: FaultStack) -> Iterator[None]:
    """Each test starts the workers it needs; none survive into the next test."""
    yield
    mq.stop_workers()


def submit_batch(base: str, bodies: list[dict[str, object]]) -> str:
    lines = "\n".join(
        json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": b})
        for i, b in enumerate(bodies)
    )
    response = requests.post(f"{base}/v1/batches", files={"file": ("in.jsonl", lines)}, timeout=30)
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def batch_job_ids(mq: FaultStack, batch_id: str, count: int) -> list[str]:
    with mq.client() as client:
        items = wait_for(
            lambda: client.lrange(keys.batch_items(batch_id), 0, -1), 10, "the batch's items"
        )
    ids = [job_id for item in items for job_id in json.loads(item)["job_ids"]]
    assert len(ids) == count
    return ids


def test_queues_are_durable_priority_queues(mq: FaultStack, rabbit: RabbitNode) -> None:
    mq.worker("declare", ("demo",))
    listed = rabbit.ctl("list_queues", "name", "type", "durable", "arguments", "--quiet")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in listed.stdout.splitlines()}
    for name in (keys.model_queue("demo"), keys.WEBHOOK_QUEUE):
        kind, durable, arguments = rows[name]
        assert (kind, durable) == ("classic", "true"), rows[name]
        assert "x-max-priority" in arguments
    assert not any(name.endswith(".batch") for name in rows)  # one queue per model


def test_submit_stream_and_cancel_on_rabbitmq(mq: FaultStack) -> None:
    mq.worker("serve", ("demo", "slow"))
    body = {"prompt": "The socket", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    job = submit(mq.web_url, body)
    stream = read_sse(mq.web_url, job["id"], timeout=60)
    assert_gapless(stream)
    assert stream.done is not None and stream.done["status"] == "succeeded"
    assert len(stream.tokens) == 40
    # A running job stops within a step of its cancel.
    running = submit(mq.web_url, {"prompt": "The", **LONG})
    wait_for(lambda: tokens_streamed(mq.web_url, running["id"]) > 0, 30, "the long job")
    answer = requests.post(f"{mq.web_url}/v1/jobs/{running['id']}/cancel", timeout=10)
    assert answer.status_code in (200, 202), answer.text  # 200 if it stopped already
    canceled = poll_until_finished(mq.web_url, running["id"], timeout=30)
    assert (canceled["status"], canceled["finish_reason"]) == ("canceled", "canceled")
    assert canceled["usage"]["completion_tokens"] < 1500
    # A queued one (no worker serves its model) is canceled on the spot.
    parked = submit(mq.web_url, {"prompt": "Wait", "model": "parked"})
    answer = requests.post(f"{mq.web_url}/v1/jobs/{parked['id']}/cancel", timeout=10)
    assert answer.status_code == 200 and answer.json()["status"] == "canceled"


def test_interactive_work_overtakes_queued_batch_work(mq: FaultStack) -> None:
    worker = mq.worker("solo", ("solo",))
    body = {"model": "solo", "prompt": "Batch", "max_tokens": 200, "ignore_eos": True}
    batch_id = submit_batch(mq.web_url, [body] * 4)
    batch_ids = batch_job_ids(mq, batch_id, 4)
    # Its first token, not just its claim: "before" below counts by first-token time.
    wait_for(
        lambda: any(tokens_streamed(mq.web_url, j) >= 1 for j in batch_ids),
        30,
        "the first batch job's first token",
    )
    urgent = submit(mq.web_url, {"model": "solo", "prompt": "Now", "max_tokens": 5})
    finished = [poll_until_finished(mq.web_url, j, timeout=90) for j in [urgent["id"], *batch_ids]]
    assert {job["status"] for job in finished} == {"succeeded"}

    def first_token_at(job: dict[str, object]) -> float:
        metrics = job["metrics"]
        assert isinstance(metrics, dict)
        created = job["created_at"]
        assert isinstance(created, float)
        return created + float(metrics["time_to_first_token_seconds"])

    urgent_done, batch_done = finished[0], finished[1:]
    before = [j for j in batch_done if first_token_at(j) < float(urgent_done["created_at"])]
    after = [j for j in batch_done if j not in before]
    # One slot: the batch job running when it arrived finished first, then the interactive job
    # ran before the three batch jobs still queued.
    assert len(before) == 1
    assert all(first_token_at(urgent_done) < first_token_at(j) for j in after)
    # Idle, the worker's warm shutdown is prompt.
    worker.terminate()
    assert worker.wait(10) == 0


def kill_the_worker_running(mq: FaultStack, job_id: str, workers: dict[str, Popen[bytes]]) -> None:
    """SIGKILL whichever of ``workers`` (by node name) holds the job's lease, mid-job."""
    wait_for(lambda: tokens_streamed(mq.web_url, job_id) >= 100, 30, "the job's first tokens")
    with mq.client() as client:
        owner = str(client.hget(keys.job(job_id), "owner") or "")
    (name,) = [name for name in workers if owner.startswith(f"{name}@")]
    os.kill(workers[name].pid, signal.SIGKILL)


def test_killed_worker_job_resumes_on_another_without_gap(mq: FaultStack) -> None:
    # Both up before the job, whichever takes it (a worker starting under load takes seconds).
    workers = {name: mq.worker(name, ("slow",)) for name in ("crash-a", "crash-b")}
    job = submit(mq.web_url, {"prompt": "The", **LONG})
    reader, results = stream_in_background(mq.web_url, job["id"])
    kill_the_worker_running(mq, job["id"], workers)
    reader.join(120)
    (stream,) = results
    assert_gapless(stream)
    assert stream.done is not None
    assert stream.done["status"] == "succeeded"
    assert stream.done["attempts"] == 2
    assert len(stream.tokens) == 1500


def test_killed_worker_batch_job_resumes_without_gap(mq: FaultStack) -> None:
    workers = {name: mq.worker(name, ("slow",)) for name in ("batch-a", "batch-b")}
    batch_id = submit_batch(mq.web_url, [{**LONG, "prompt": "If"}])
    (job_id,) = batch_job_ids(mq, batch_id, 1)
    kill_the_worker_running(mq, job_id, workers)
    final = poll_until_finished(mq.web_url, job_id, timeout=120)
    assert (final["status"], final["attempts"]) == ("succeeded", 2)
    with mq.client() as client:
        log = client.lrange(keys.job_tokens(job_id), 0, -1)
    indexes = [json.loads(entry)["index"] for entry in log]
    assert indexes == list(range(1500))
    assert "".join(json.loads(entry)["text"] for entry in log) == final["output"]


def test_queue_bound_reads_rabbitmq_and_every_accepted_job_completes(mq: FaultStack) -> None:
    base = mq.web_url
    accepted = [submit(base, {"prompt": f"Wait {i}", "model": "late"})["id"] for i in range(3)]
    # A batch job counts towards the bound too: it waits in the model's queue, at low priority.
    batch_id = submit_batch(base, [{"model": "late", "prompt": "Later", "max_tokens": 4}])
    accepted += batch_job_ids(mq, batch_id, 1)

    def scaling() -> dict[str, float]:
        return requests.get(f"{base}/scaling/late", timeout=10).json()  # type: ignore[no-any-return]

    wait_for(lambda: scaling()["queue_depth"] == QUEUE_LIMIT, 10, "four queued messages")
    refused = requests.post(f"{base}/v1/jobs", json={"prompt": "x", "model": "late"}, timeout=10)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "queue_full"
    assert int(refused.headers["Retry-After"]) > 0
    assert scaling()["oldest_queued_seconds"] > 0
    metrics = requests.get(f"{base}/metrics", timeout=10).text
    assert parse_samples(metrics)['trickle_queue_depth{model="late"}'] == QUEUE_LIMIT
    mq.worker("drain", ("late",))
    finished = [poll_until_finished(base, job_id, timeout=60) for job_id in accepted]
    assert {job["status"] for job in finished} == {"succeeded"}
    wait_for(lambda: scaling()["queue_depth"] == 0, 10, "the queues to drain")
