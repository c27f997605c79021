"""Recovery paths on real processes, by fault injection (tests/inject/sitecustomize.py wraps
CTranslate2, SentencePiece and redis-py in the worker for prompts with a marker character):

- one job whose tokens cannot be processed fails alone; a failing engine call fails its jobs; in
  both cases the stream ends with what was stored and the worker goes on serving;
- Redis stopped in the middle of a job: the worker's flushes retry until it is back, and every
  token lands exactly once;
- a worker killed after its last token, before its result is stored: another worker recovers
  the job and finishes it with exactly the tokens asked for, none twice.

These pin the public contract (HTTP, streams, the stored job), not the publisher or scheduler.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.clients import StreamResult, get_job, poll_until_finished, read_sse, submit
from tests.faultstack import (
    FaultStack,
    build_fault_stack,
    build_slow_model,
    tokens_streamed,
    wait_for,
)
from tests.metrics_text import parse_samples
from trickle import keys

INJECT = Path(__file__).parents[1] / "inject"
ENGINE_FAILS = "The ☢"  # generate_batch raises for any batch holding this prompt
TOKENS_FAIL = "The ☠"  # decoding this job's tokens raises
DIES_AT_THE_END = "The ☣"  # the worker is killed as it stores this job's result

# Each test starts and kills real processes: a longer ceiling than the suite's 60 s.
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    root = tmp_path_factory.mktemp("recovery")
    slow = build_slow_model(
        root, demo_model_dir / "tokenizer.model", d_model=256, num_layers=4, ffn_dim=768
    )
    stack = build_fault_stack(
        root,
        models_toml=(
            f'[models.demo]\npath = "{demo_model_dir}"\ninter_threads = 1\n'
            f'[models.slow]\npath = "{slow}"\ninter_threads = 1\n'
            # Waits long enough for company that jobs submitted together share one batch.
            f'[models.batchy]\npath = "{demo_model_dir}"\ninter_threads = 1\n'
            "tuning.max_batch_wait_ms = 500\ntuning.quiet_start_after_ms = 0\n"
        ),
        settings_toml=(
            "[worker]\nlease_seconds = 2\nrecovery_interval_seconds = 0.5\n"
            "heartbeat_seconds = 0.5\nvisibility_timeout_seconds = 3\n"
            "[limits]\nmax_tokens_ceiling = 2000\n"
            "[web]\nkeepalive_seconds = 1.0\n"
        ),
        append_only=True,
    )
    yield stack
    stack.close()


@pytest.fixture
def injected(faults: FaultStack) -> Iterator[FaultStack]:
    """A worker with the fault shim, for this test only."""
    faults.worker("injected", ("demo", "slow", "batchy"), PYTHONPATH=str(INJECT))
    yield faults
    faults.stop_workers()


def job_body(prompt: str, max_tokens: int = 200, model: str = "demo") -> dict[str, Any]:
    return {
        "prompt": prompt,
        "model": model,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }


def run(base: str, prompt: str, max_tokens: int = 200, model: str = "demo") -> StreamResult:
    job = submit(base, job_body(prompt, max_tokens, model))
    stream = read_sse(base, job["id"], timeout=60)
    assert stream.done is not None, stream.error
    return stream


def assert_consistent(stream: StreamResult) -> None:
    assert stream.done is not None
    assert stream.indexes == list(range(len(stream.tokens)))
    assert stream.text == stream.done["output"]


def test_a_job_whose_tokens_cannot_be_processed_fails_alone(injected: FaultStack) -> None:
    base = injected.web_url
    # Same sampling options, submitted together: they share one engine call.
    prompts = ["The value", TOKENS_FAIL, "The module", "The list"]
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        streams = list(pool.map(lambda p: run(base, p, model="batchy"), prompts))
    by_prompt = dict(zip(prompts, streams, strict=True))
    failed = by_prompt.pop(TOKENS_FAIL)
    assert failed.done is not None and failed.done["status"] == "failed"
    assert failed.done["error"]["type"] == "engine_error"
    assert "injected detokenizer failure" in failed.done["error"]["message"]
    assert failed.done["finish_reason"] == "error"
    assert_consistent(failed)
    for stream in by_prompt.values():
        assert stream.done is not None and stream.done["status"] == "succeeded"
        assert len(stream.tokens) == 200
        assert_consistent(stream)
    # And they did share the engine call (workers flush metrics every 2 s).
    wait_for(lambda: batch_sizes(base) == (1.0, 4.0), 10, "one batch of the four jobs in /metrics")


def batch_sizes(base: str) -> tuple[float, float]:
    """(generate_batch calls, jobs in them) for the batchy model, from /metrics."""
    samples = parse_samples(requests.get(f"{base}/metrics", timeout=10).text)
    count = samples.get('trickle_batch_size_count{model="batchy"}', 0.0)
    return count, samples.get('trickle_batch_size_sum{model="batchy"}', 0.0)


def test_a_failing_engine_fails_its_jobs_and_the_worker_goes_on(injected: FaultStack) -> None:
    base = injected.web_url
    failed = run(base, ENGINE_FAILS, 50)
    assert failed.done is not None and failed.done["status"] == "failed"
    assert failed.done["error"]["type"] == "engine_error"
    assert "injected engine failure" in failed.done["error"]["message"]
    assert failed.tokens == [] and failed.done["output"] == ""
    assert failed.done["attempts"] == 1  # an engine error is an answer, not a lost worker
    # The worker survived: the next jobs run normally.
    after = run(base, "The value", 30)
    assert after.done is not None and after.done["status"] == "succeeded"
    assert len(after.tokens) == 30
    assert_consistent(after)
    seeded = submit(base, {**job_body(ENGINE_FAILS, 5), "seed": 1, "temperature": 1.0}, wait=30)
    assert seeded["status"] == "failed" and seeded["error"]["type"] == "engine_error"


def test_redis_stopped_mid_job_every_token_lands_once(injected: FaultStack) -> None:
    base = injected.web_url
    job = submit(base, job_body("The value", 600, model="slow"))
    wait_for(lambda: tokens_streamed(base, job["id"]) >= 20, 60, "the job to be streaming")
    injected.stop_redis()  # flushes now fail; the worker retries them
    try:
        wait_for(lambda: "retrying" in worker_log(injected), 30, "a retried flush")
    finally:
        injected.start_redis(append_only=True)
    stream = read_sse(base, job["id"], timeout=120)
    assert stream.done is not None and stream.done["status"] == "succeeded", stream.done
    assert stream.indexes == list(range(600))
    assert stream.text == stream.done["output"]
    with injected.client() as client:  # the replay log holds each index once, in order
        log = [json.loads(entry) for entry in client.lrange(keys.job_tokens(job["id"]), 0, -1)]
    assert len(log) == 600


def test_a_worker_killed_after_its_last_token_is_recovered(injected: FaultStack) -> None:
    base = injected.web_url
    reference = submit(base, job_body("The value", 120), wait=60)
    assert reference["status"] == "succeeded"
    dying = injected.workers[0]
    job = submit(base, job_body(f"{DIES_AT_THE_END} value", 120))
    dying.wait(60)  # killed as it stored the result; its last tokens went out first
    assert dying.returncode == -signal.SIGKILL
    assert tokens_streamed(base, job["id"]) == 120
    assert get_job(base, job["id"])["status"] == "running"
    injected.worker("rescuer", ("demo",))  # no fault shim: it can store the result
    stream = read_sse(base, job["id"], timeout=60)
    assert stream.done is not None and stream.done["status"] == "succeeded", stream.done
    assert stream.done["attempts"] == 1  # its tokens were all stored: finishing it is no attempt
    assert stream.indexes == list(range(120))  # nothing generated twice, nothing missing
    assert stream.done["usage"]["completion_tokens"] == 120
    assert stream.text == stream.done["output"]
    # Greedy, so the text is the one an undisturbed run writes (bar the marker's context).
    assert len(stream.done["output"]) > 0 and reference["output"]


def worker_log(faults: FaultStack) -> str:
    return (faults.log_dir / "injected.log").read_text(errors="replace")


def test_a_task_taken_by_a_worker_killed_before_its_claim_runs(faults: FaultStack) -> None:
    """A consumer that took a job's task and died before claiming it (nothing acked, nothing
    given back): kombu puts the message back after the visibility timeout, a live worker's
    Celery consumer takes it, and the job runs, once."""
    job = submit(faults.web_url, {"prompt": "The", "model": "demo", "max_tokens": 5})
    taker = subprocess.run(
        [sys.executable, "-c", TAKE_AND_DIE, keys.model_queue("demo"), job["id"]],
        env={**os.environ, "TRICKLE_CONFIG": str(faults.config_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert taker.returncode == 0 and taker.stdout.strip() == job["id"], taker.stderr
    faults.worker("rescuer", ("demo",))
    try:
        final = poll_until_finished(faults.web_url, job["id"], timeout=60)
    finally:
        faults.stop_workers()
    assert final["status"] == "succeeded" and final["usage"]["completion_tokens"] == 5
    assert final["attempts"] == 1


# Takes the job's task off a queue with a plain kombu consumer and exits without acking it
# (os._exit: no channel close, so kombu's restore-on-close never runs, as after a SIGKILL). The
# tasks it takes before the job's are left unacked too: a task an earlier test's killed worker
# held comes back after the visibility timeout, and sat ahead of this job's in one CI run.
TAKE_AND_DIE = """
import os, sys, time
from trickle.config.settings import load_settings
from trickle.queue import make_celery
settings = load_settings(environ=os.environ)
app = make_celery(settings, settings.models)
conn = app.connection_for_read()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    message = conn.default_channel.basic_get(sys.argv[1], no_ack=False)
    if message is None:
        time.sleep(0.05)
    elif message.decode()[0][0] == sys.argv[2]:
        print(sys.argv[2], flush=True)
        break
os._exit(0)
"""
