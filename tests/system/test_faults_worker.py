"""Worker faults on real processes: SIGKILL, SIGSTOP, poison jobs, SIGTERM and deadlines.

A job whose worker dies resumes on another worker from the tokens already published, so the
client's stream goes on without a gap or a duplicate.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.clients import (
    assert_gapless,
    get_job,
    poll_until_finished,
    read_sse,
    stream_in_background,
    submit,
)
from tests.faultstack import (
    FaultStack,
    build_demo_and_slow_stack,
    tokens_streamed,
    wait_for,
)
from trickle import keys
from trickle.config.settings import load_settings
from trickle.events import TokenEvent
from trickle.jobs import FinishReason, Job, new_job_id
from trickle.params import GenerationParams
from trickle.queue import enqueue_generation, make_celery
from trickle.store.job_store import JobStore, StepAppend

LEASE_SECONDS = 2.0
SWEEP_SECONDS = 0.5
LONG = {"model": "slow", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}

# Each test starts and kills real processes: a longer ceiling than the suite's 60 s.
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    stack = build_demo_and_slow_stack(
        tmp_path_factory.mktemp("worker-faults"),
        demo_model_dir,
        more_models_toml=(
            # One lane, no spare one: a newcomer beside a running job is admitted only by
            # restarting that job's batch (a long join, its pause well under the wait).
            '[models.onelane]\npath = "{slow}"\nmax_batch_size = 4\nintra_threads = 1\n'
            "inter_threads = 1\ntuning.overflow_lanes_per_device = 0\n"
            f'[models.nobody]\npath = "{demo_model_dir}"\n'
        ),
        settings_toml=(
            f"[worker]\nlease_seconds = {LEASE_SECONDS}\n"
            f"recovery_interval_seconds = {SWEEP_SECONDS}\nheartbeat_seconds = 0.5\n"
            "max_attempts = 2\nrepublish_after_seconds = 2\n"
            "[limits]\nqueued_ttl_seconds = 6\nmax_tokens_ceiling = 2000\n"
            "[web]\nkeepalive_seconds = 1.0\n"
        ),
    )
    yield stack
    stack.close()


@pytest.fixture(autouse=True)
def fresh_workers(faults: FaultStack) -> Iterator[None]:
    """Each test starts the workers it needs; none survive into the next test."""
    yield
    faults.stop_workers()


def test_killed_worker_job_resumes_on_another_without_gap(faults: FaultStack) -> None:
    # Both workers are up before the job (starting one mid-job could outlast the job on a busy
    # machine); the one holding the lease is killed once the stream is well under way.
    workers = {name: faults.worker(name, ("slow",)) for name in ("crash-a", "crash-b")}
    job = submit(faults.web_url, {"prompt": "The", **LONG})
    reader, results = stream_in_background(faults.web_url, job["id"], timeout=90)
    wait_for(lambda: tokens_streamed(faults.web_url, job["id"]) >= 100, 30, "the first tokens")
    lease = str(faults.client().get(keys.job_lease(job["id"])) or "")
    (holder,) = [name for name in workers if lease.startswith(f"{name}@")]
    os.kill(workers[holder].pid, signal.SIGKILL)
    reader.join(90)
    (stream,) = results
    assert_gapless(stream)
    assert stream.done is not None
    assert stream.done["status"] == "succeeded"
    assert stream.done["attempts"] == 2
    assert len(stream.tokens) == 1500
    # The client saw one pause: the lease lapsing plus a sweep, then the resumed stream.
    gaps = [b - a for a, b in zip(stream.arrivals, stream.arrivals[1:], strict=False)]
    assert max(gaps) < LEASE_SECONDS + SWEEP_SECONDS + 3.0


def test_a_newcomer_admitted_by_a_restart_resumes_with_its_batch_after_a_crash(
    faults: FaultStack,
) -> None:
    """A newcomer joins the only lane's running batch by a restart (no lane is free), then the
    worker dies: both jobs resume on another worker from what they had streamed, each stream
    gapless, each as long as asked."""
    first = faults.worker("join-a", ("onelane",))
    runner = submit(faults.web_url, {"prompt": "The", **LONG, "model": "onelane"})
    runner_reader, runner_results = stream_in_background(faults.web_url, runner["id"], timeout=90)
    wait_for(lambda: tokens_streamed(faults.web_url, runner["id"]) >= 60, 30, "the runner's tokens")
    newcomer = submit(
        faults.web_url, {"prompt": "A socket", **LONG, "model": "onelane", "max_tokens": 300}
    )
    reader, results = stream_in_background(faults.web_url, newcomer["id"], timeout=90)
    wait_for(lambda: tokens_streamed(faults.web_url, newcomer["id"]) >= 20, 30, "its first tokens")
    assert tokens_streamed(faults.web_url, runner["id"]) < 1500  # admitted beside it: a restart
    faults.worker("join-b", ("onelane",))
    os.kill(first.pid, signal.SIGKILL)
    runner_reader.join(90)
    reader.join(90)
    for (stream,), length in ((runner_results, 1500), (results, 300)):
        assert_gapless(stream)
        assert stream.done is not None and stream.done["status"] == "succeeded"
        # On a slow machine the newcomer may log its last token before the kill: the next
        # claim then finalizes it as it stands, counting no attempt (docs/guarantees.md).
        assert stream.done["attempts"] in ({2} if length == 1500 else {1, 2})
        assert len(stream.tokens) == length


def test_a_job_whose_last_worker_died_after_its_last_token_is_finished_not_failed(
    faults: FaultStack,
) -> None:
    """Its two attempts (max_attempts) died, the second after logging the token that ended it
    (a stop string; the entry says so) and before storing the result: a worker's next claim
    counts no attempt and stores the job as it stands, succeeded with the logged text."""
    settings = load_settings(faults.config_path)
    params = GenerationParams(max_tokens=50, stop=["\n"])
    job = Job(new_job_id(), "demo", "The", params, created_at=time.time())
    with faults.client() as client:
        store = JobStore(client, result_ttl_seconds=60, queued_ttl_seconds=60)
        store.create(job)
        logged = [
            [TokenEvent(job.id, 0, "Once"), TokenEvent(job.id, 1, " upon")],
            [TokenEvent(job.id, 2, " a time", end=FinishReason.STOP, stop_sequence="\n")],
        ]
        for attempt, events in enumerate(logged):  # each worker "dies": its lease lapses
            claim = store.leases.claim(job.id, f"dead{attempt}", time.time(), 50, max_attempts=2)
            assert claim.claimed
            append = StepAppend(job.id, claim.fence, events)
            pipe = client.pipeline(transaction=False)
            store.queue_step(pipe, [append])
            assert store.step_outcome([append], *pipe.execute()).fenced_out == []
            wait_for(lambda: not client.exists(keys.job_lease(job.id)), 5, "the lease lapse")
            assert store.leases.recover_orphans(time.time()).get(job.id) == "requeued"
    faults.worker("finisher", ("demo",))
    enqueue_generation(make_celery(settings, settings.models), job.id, "demo")
    final = poll_until_finished(faults.web_url, job.id, timeout=30)
    assert final["status"] == "succeeded", final
    assert final["output"] == "Once upon a time" and final["finish_reason"] == "stop"
    assert final["usage"]["completion_tokens"] == 3 and final["attempts"] == 2
    stream = read_sse(faults.web_url, job.id, timeout=30)
    assert stream.text == "Once upon a time" and stream.done is not None


def test_stalled_worker_is_fenced_out_when_it_wakes(faults: FaultStack) -> None:
    stalled = faults.worker("stall-a", ("slow",))
    job = submit(faults.web_url, {"prompt": "If", **LONG})
    reader, results = stream_in_background(faults.web_url, job["id"], timeout=90)
    wait_for(lambda: tokens_streamed(faults.web_url, job["id"]) >= 50, 30, "tokens from a")
    os.kill(stalled.pid, signal.SIGSTOP)  # alive but silent: its lease lapses
    try:
        faults.worker("stall-b", ("slow",))  # started after the stop: the job is still running
        wait_for(lambda: get_job(faults.web_url, job["id"])["attempts"] == 2, 30, "takeover")
    finally:
        os.kill(stalled.pid, signal.SIGCONT)  # wakes up believing it still runs the job
    reader.join(90)
    (stream,) = results
    assert_gapless(stream)
    assert stream.done is not None and stream.done["status"] == "succeeded"
    with faults.client() as client:
        log = client.lrange(keys.job_tokens(job["id"]), 0, -1)
    indexes = [int(entry.split('"index": ')[1].split(",")[0]) for entry in log]
    assert indexes == list(range(1500))  # the woken worker wrote nothing after losing its lease


def test_sigterm_hands_back_waiting_jobs_and_finishes_running_ones(faults: FaultStack) -> None:
    # One engine thread and no overflow lane, so jobs that cannot join the running batch really
    # wait (an overflow lane would start them beside it).
    leaving = faults.worker(
        "term-a", ("slow",), TRICKLE__MODELS__SLOW__INTER_THREADS="1",
        TRICKLE__MODELS__SLOW__TUNING__OVERFLOW_LANES_PER_DEVICE="0",
    )  # fmt: skip
    # Long enough to still run once the next worker is up (a few seconds on a loaded machine).
    running = submit(faults.web_url, {"prompt": "The", **LONG})
    wait_for(lambda: tokens_streamed(faults.web_url, running["id"]) > 0, 30, "batch started")
    # A different sampling configuration cannot join the running batch: these wait.
    waiting = [
        submit(
            faults.web_url, {"prompt": "A", "model": "slow", "max_tokens": 50, "temperature": 0.8}
        )
        for _ in range(3)
    ]
    wait_for(
        lambda: all(get_job(faults.web_url, job["id"])["status"] == "running" for job in waiting),
        30,
        "the waiting jobs to be claimed by the leaving worker",
    )
    # The next worker is up before the hand-back: a handed-back job waits at most the queue TTL
    # (6 s here), less than a worker can take to start on a loaded machine.
    faults.worker("term-b", ("slow",))
    assert get_job(faults.web_url, running["id"])["status"] == "running"  # still: waiters wait
    leaving.send_signal(signal.SIGTERM)
    finished = [poll_until_finished(faults.web_url, job["id"], 60) for job in [running, *waiting]]
    assert [job["status"] for job in finished] == ["succeeded"] * 4
    assert all(job["attempts"] == 1 for job in finished)  # handing back is not an attempt
    assert finished[0]["usage"]["completion_tokens"] == LONG["max_tokens"]
    leaving.wait(30)
    log = (faults.log_dir / "term-a.log").read_text()
    assert "3 waiting job(s) handed back" in log


def test_execution_deadline_stops_and_fails_the_job(faults: FaultStack) -> None:
    faults.worker("deadline", ("slow",), TRICKLE__LIMITS__MAX_JOB_SECONDS="1")
    job = submit(faults.web_url, {"prompt": "The", **LONG})
    stream = read_sse(faults.web_url, job["id"], timeout=60)
    assert stream.done is not None
    assert stream.done["status"] == "failed"
    assert stream.done["error"]["type"] == "deadline_exceeded"
    assert stream.text == stream.done["output"]
    assert 0 < len(stream.tokens) < 1500


def test_job_nobody_starts_expires_after_the_queue_ttl(faults: FaultStack) -> None:
    faults.worker("sweeper", ("demo",))
    job = submit(faults.web_url, {"prompt": "The", "model": "nobody", "max_tokens": 5})
    stream = read_sse(faults.web_url, job["id"], timeout=30)
    assert stream.done is not None and stream.done["status"] == "failed"
    assert stream.done["error"]["type"] == "queue_timeout"
    assert requests.get(f"{faults.web_url}/v1/jobs/{job['id']}", timeout=5).status_code == 200


def test_a_job_nobody_starts_ends_expired_at_its_deadline(faults: FaultStack) -> None:
    # No worker serves "nobody": only the deadline sweep (any worker's, here one serving
    # "demo") can end it, and its readers must hear it then, not at the queue TTL (6 s).
    faults.worker("sweeper", ("demo",))
    deadline = time.time() + 1.5
    body = {"prompt": "The", "model": "nobody", "max_tokens": 5, "deadline": deadline}
    job = submit(faults.web_url, body)
    assert job["status"] == "queued"
    stream = read_sse(faults.web_url, job["id"], timeout=30)
    heard = time.time()
    assert stream.done is not None and stream.done["status"] == "expired", stream.done
    assert stream.done["finish_reason"] == "deadline"
    assert stream.done["error"]["type"] == "deadline_exceeded"
    assert stream.tokens == []
    assert deadline <= heard < deadline + 1.5  # the sweep runs every 0.5 s
    record = get_job(faults.web_url, job["id"])
    assert record["status"] == "expired" and record["error"] == stream.done["error"]
    assert deadline <= record["completed_at"] < deadline + 1.0


def test_a_job_record_whose_task_was_never_published_is_published_again(
    faults: FaultStack,
) -> None:
    """The web process died between writing a job's record and publishing its task: the record
    is queued and nothing in the queue names it. A live worker's sweep publishes it again."""
    worker = faults.worker("republisher", ("demo",))
    try:
        params = GenerationParams(max_tokens=5, ignore_eos=True)
        job = Job(new_job_id(), "demo", "The", params, created_at=time.time())
        with faults.client() as client:
            JobStore(client, result_ttl_seconds=60, queued_ttl_seconds=6).create(job)
        final = poll_until_finished(faults.web_url, job.id, timeout=30)
        assert final["status"] == "succeeded" and final["usage"]["completion_tokens"] == 5
        assert final["attempts"] == 1
    finally:
        faults.stop_workers()
    assert worker.returncode is not None
    log = (faults.log_dir / "republisher.log").read_text()
    assert f'"event": "republished", "job_id": "{job.id}"' in log


def test_a_job_its_worker_cannot_start_fails_with_the_reason_and_the_next_one_runs(
    faults: FaultStack,
) -> None:
    """A job past its model's context (the web tier refuses such a request; its record and task
    are written here directly) fails ``invalid_request`` when the worker's claim thread starts
    it, and the claim thread goes on claiming."""
    worker = faults.worker("starter", ("demo",))
    try:
        settings = load_settings(faults.config_path)
        limit = settings.models["demo"].max_context_tokens
        params = GenerationParams(max_tokens=limit + 10, ignore_eos=True)
        job = Job(new_job_id(), "demo", "The", params, created_at=time.time())
        with faults.client() as client:
            JobStore(client, result_ttl_seconds=60, queued_ttl_seconds=60).create(job)
        enqueue_generation(make_celery(settings, settings.models), job.id, "demo")
        failed = poll_until_finished(faults.web_url, job.id, timeout=30)
        assert failed["status"] == "failed"
        assert failed["error"]["type"] == "invalid_request"
        assert str(limit) in failed["error"]["message"]
        after = submit(faults.web_url, {"model": "demo", "prompt": "The", "max_tokens": 3})
        final = poll_until_finished(faults.web_url, after["id"], timeout=30)
        assert final["status"] == "succeeded" and final["usage"]["completion_tokens"] == 3
    finally:
        faults.stop_workers()
    assert worker.returncode is not None


def response_events(base: str, response_id: str, after: int | None = None) -> list[str]:
    """A response's stream (resumed after ``after``) as its raw data lines."""
    query = "" if after is None else f"&starting_after={after}"
    url = f"{base}/v1/responses/{response_id}?stream=true{query}"
    with requests.get(url, stream=True, timeout=90) as reply:
        assert reply.status_code == 200
        return [line for line in reply.iter_lines(decode_unicode=True) if line.startswith("data:")]


def test_a_background_response_survives_its_workers_death(faults: FaultStack) -> None:
    """The stream read across the crash, and every replay after it, are the same events under
    the same sequence numbers: they are numbered from the job's token log."""
    workers = {name: faults.worker(name, ("slow",)) for name in ("resp-a", "resp-b")}
    body = {"model": "slow", "input": "The", "max_output_tokens": 1500, "temperature": 0}
    created = requests.post(
        f"{faults.web_url}/v1/responses",
        json={**body, "background": True, "ignore_eos": True},
        timeout=30,
    ).json()
    job_id = "job_" + created["id"].removeprefix("resp_")
    live: list[str] = []
    reader = threading.Thread(
        target=lambda: live.extend(response_events(faults.web_url, created["id"]))
    )
    reader.start()
    wait_for(lambda: tokens_streamed(faults.web_url, job_id) >= 100, 30, "the first tokens")
    lease = str(faults.client().get(keys.job_lease(job_id)) or "")
    (holder,) = [name for name in workers if lease.startswith(f"{name}@")]
    os.kill(workers[holder].pid, signal.SIGKILL)
    reader.join(90)
    events = [json.loads(line[6:]) for line in live]
    assert [e["sequence_number"] for e in events] == list(range(4 + 1500 + 4))
    assert events[-1]["type"] == "response.incomplete"
    assert get_job(faults.web_url, job_id)["attempts"] == 2
    assert response_events(faults.web_url, created["id"]) == live
    assert response_events(faults.web_url, created["id"], after=700) == live[701:]
