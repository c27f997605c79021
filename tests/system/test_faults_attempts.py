"""Which worker deaths count against a job, and what a dead worker leaves behind.

Only deaths that made no progress count toward ``worker.max_attempts`` (``store.scripts.CLAIM``):
a job resumed after each of more kills than that still ends succeeded, while a job whose
workers die before logging a token fails ``worker_lost``. A SIGKILLed worker's engine process
exits with it (``worker.engine.parent_watch``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.clients import assert_gapless, get_job, poll_until_finished, stream_in_background, submit
from tests.faultstack import (
    FaultStack,
    build_demo_and_slow_stack,
    tokens_streamed,
    wait_for,
)

LEASE_SECONDS = 2.0
LONG = {"model": "slow", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}

# Each test starts and kills real processes: a longer ceiling than the suite's 60 s.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    stack = build_demo_and_slow_stack(
        tmp_path_factory.mktemp("attempt-faults"),
        demo_model_dir,
        settings_toml=(
            f"[worker]\nlease_seconds = {LEASE_SECONDS}\n"
            "recovery_interval_seconds = 0.5\nheartbeat_seconds = 0.5\nmax_attempts = 2\n"
            "[limits]\nmax_tokens_ceiling = 2000\n"
        ),
    )
    yield stack
    stack.close()


@pytest.fixture(autouse=True)
def fresh_workers(faults: FaultStack) -> Iterator[None]:
    yield
    faults.stop_workers()


def engine_of(worker_pid: int) -> psutil.Process:
    """The worker's CTranslate2 process (``multiprocessing``'s spawned child, not its resource
    tracker)."""
    children = psutil.Process(worker_pid).children(recursive=True)
    (engine,) = [child for child in children if "spawn_main" in " ".join(child.cmdline())]
    return engine


def test_the_engine_process_exits_when_its_worker_is_killed(faults: FaultStack) -> None:
    worker = faults.worker("orphan-a", ("demo",))
    engine = engine_of(worker.pid)
    os.kill(worker.pid, signal.SIGKILL)  # the worker alone, as an OOM kill takes it
    worker.wait(10)
    wait_for(lambda: not engine.is_running() or engine.status() == "zombie", 5, "engine's exit")


def test_a_job_resumed_after_more_kills_than_max_attempts_succeeds(faults: FaultStack) -> None:
    """Three workers die in turn under one job (max_attempts is 2), each after it streamed more:
    the kills of a busy machine, not a job that kills its workers. The fourth finishes it."""
    job = submit(faults.web_url, {"prompt": "The", **LONG, "max_tokens": 300})
    reader, results = stream_in_background(faults.web_url, job["id"], timeout=240)
    for claims, name in enumerate(("progress-a", "progress-b", "progress-c"), 1):
        worker = faults.worker(name, ("slow",))
        wait_for(lambda n=claims: get_job(faults.web_url, job["id"])["attempts"] == n, 30, "claim")
        done = tokens_streamed(faults.web_url, job["id"])
        wait_for(lambda d=done: tokens_streamed(faults.web_url, job["id"]) > d, 30, "progress")
        kill_with_engine(worker)
    faults.worker("progress-d", ("slow",))
    reader.join(240)
    (stream,) = results
    assert_gapless(stream)
    assert stream.done is not None and stream.done["status"] == "succeeded", stream.done
    assert stream.done["attempts"] == 4 and len(stream.tokens) == 300


def test_a_job_whose_workers_die_before_it_makes_progress_fails(faults: FaultStack) -> None:
    """Each worker holds the job while its engine is stopped (SIGSTOP: nothing is generated)
    and dies: after max_attempts such deaths the next claim fails it ``worker_lost``. Each next
    worker is up, its engine stopped, before the previous one dies, so no claim can generate."""
    held = stalled_worker(faults, "poison-a")
    job = submit(faults.web_url, {"prompt": "A", **LONG})
    wait_for(lambda: get_job(faults.web_url, job["id"])["attempts"] == 1, 30, "first claim")
    following = stalled_worker(faults, "poison-b")
    kill_with_engine(held)
    wait_for(lambda: get_job(faults.web_url, job["id"])["attempts"] == 2, 30, "second claim")
    kill_with_engine(following)
    faults.worker("poison-c", ("slow",))
    final = poll_until_finished(faults.web_url, job["id"], timeout=30)
    assert final["status"] == "failed"
    assert final["error"]["type"] == "worker_lost"
    assert "2 times before the job made progress" in final["error"]["message"]
    assert final["usage"]["completion_tokens"] == 0


def stalled_worker(faults: FaultStack, name: str) -> subprocess.Popen[bytes]:
    """A worker serving ``slow`` whose engine process is stopped: it claims, never generates."""
    worker = faults.worker(name, ("slow",))
    engine_of(worker.pid).suspend()
    return worker


def kill_with_engine(worker: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker and its engine (a stopped engine cannot notice its parent's death)."""
    engine = engine_of(worker.pid)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    with contextlib.suppress(psutil.NoSuchProcess):
        engine.kill()
