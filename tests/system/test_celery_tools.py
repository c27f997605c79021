"""Celery carries every generation job, so Celery's own tools see them; leases still decide runs.

Real processes: an embedded Redis, gunicorn, Celery workers and a small model. Celery's remote
control (``inspect active`` and ``stats``, the API behind ``celery inspect``) is asked while a
job runs; a duplicate task (what a redelivery is) is published while the first run is alive;
task events (Flower's feed) are captured with ``app.events.Receiver`` on a worker that sends
them.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.clients import assert_gapless, poll_until_finished, stream_in_background, submit
from tests.faultstack import (
    FaultStack,
    build_fault_stack,
    build_slow_model,
    tokens_streamed,
    wait_for,
)
from trickle import keys
from trickle.config.settings import load_settings
from trickle.queue import enqueue_generation, make_celery

LONG = {"model": "slow", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[FaultStack]:
    root = tmp_path_factory.mktemp("celery-tools")
    slow = build_slow_model(root, demo_model_dir / "tokenizer.model")
    stack = build_fault_stack(
        root,
        models_toml=(
            f'[models.demo]\npath = "{demo_model_dir}"\n'
            f'[models.slow]\npath = "{slow}"\nmax_batch_size = 4\nintra_threads = 1\n'
        ),
        settings_toml="[limits]\nmax_tokens_ceiling = 2000\n",
    )
    yield stack
    stack.close()


def celery_app(stack: FaultStack) -> Any:
    settings = load_settings(environ={"TRICKLE_CONFIG": str(stack.config_path)})
    return make_celery(settings, settings.models)


def job_log(stack: FaultStack, worker: str) -> list[dict[str, Any]]:
    lines = (stack.log_dir / f"{worker}.log").read_text().splitlines()
    return [
        json.loads(line.split("trickle.jobs:", 1)[1]) for line in lines if "trickle.jobs:{" in line
    ]


def test_inspect_lists_the_running_job_and_stats_count_it(tools: FaultStack) -> None:
    tools.worker("inspected", ("slow",))
    try:
        job = submit(tools.web_url, {"prompt": "The", **LONG})
        wait_for(lambda: tokens_streamed(tools.web_url, job["id"]) > 0, 30, "the job's tokens")
        inspect = celery_app(tools).control.inspect(timeout=5)
        active = wait_for(inspect.active, 15, "an answer to inspect active")
        (tasks,) = [found for node, found in active.items() if node.startswith("inspected@")]
        (running,) = tasks
        assert running["name"] == keys.GENERATE_TASK
        assert running["args"] == [job["id"]]
        assert running["acknowledged"] is False  # acked once its result is stored
        poll_until_finished(tools.web_url, job["id"], timeout=60)
        stats = wait_for(inspect.stats, 15, "an answer to inspect stats")
        (node_stats,) = [found for node, found in stats.items() if node.startswith("inspected@")]
        assert node_stats["total"][keys.GENERATE_TASK] >= 1
        assert (
            wait_for(lambda: inspect.active() or None, 15, "inspect active").get(
                next(n for n in active if n.startswith("inspected@"))
            )
            == []
        )
    finally:
        tools.stop_workers()


def test_a_task_redelivered_while_its_job_runs_makes_one_run_and_one_stream(
    tools: FaultStack,
) -> None:
    """The broker gives a job's task again while its first run is alive (a redelivery looks
    exactly like this second publish): the lease says the job is running, so the second copy
    is acked without running, and the one stream is exact."""
    tools.worker("first", ("slow",))
    tools.worker("second", ("slow",))
    try:
        job = submit(tools.web_url, {"prompt": "Once", **LONG})
        reader, results = stream_in_background(tools.web_url, job["id"], timeout=90)
        wait_for(lambda: tokens_streamed(tools.web_url, job["id"]) >= 20, 30, "the first run")
        app = celery_app(tools)
        for _ in range(2):
            enqueue_generation(app, job["id"], "slow")
        final = poll_until_finished(tools.web_url, job["id"], timeout=90)
        reader.join(90)
    finally:
        tools.stop_workers()
    (stream,) = results
    assert_gapless(stream)
    assert stream.done is not None and stream.done["status"] == "succeeded"
    assert len(stream.tokens) == 1500 and stream.text == final["output"]
    assert final["attempts"] == 1
    entries = job_log(tools, "first") + job_log(tools, "second")
    claimed = [e for e in entries if e["event"] == "claimed" and e["job_id"] == job["id"]]
    assert len(claimed) == 1
    logs = (tools.log_dir / "first.log").read_text() + (tools.log_dir / "second.log").read_text()
    assert logs.count(f"job {job['id']} not run: running") == 2


def test_task_events_on_change_nothing_but_events(tools: FaultStack) -> None:
    """Flower's feed: with task events on, the same route runs the job, and Celery's events
    name it from received to succeeded."""
    tools.worker("evented", ("demo",), TRICKLE__WORKER__TASK_EVENTS="true")
    app = celery_app(tools)
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    receivers: list[Any] = []

    def capture() -> None:
        with app.connection_for_read() as conn:
            receiver = app.events.Receiver(conn, handlers={"*": seen.append})
            receivers.append(receiver)
            ready.set()
            with contextlib.suppress(TimeoutError):
                receiver.capture(limit=None, timeout=1, wakeup=False)

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    try:
        ready.wait(10)
        # Events are fanned out: those sent before the receiver's queue is bound are nobody's.
        # A first job tells when it is listening.
        warm = submit(tools.web_url, {"prompt": "A", "model": "demo", "max_tokens": 2})
        wait_for(
            lambda: any(e.get("type") == "task-succeeded" for e in seen), 30, "the first event"
        )
        poll_until_finished(tools.web_url, warm["id"], timeout=60)
        seen.clear()
        job = submit(tools.web_url, {"prompt": "The", "model": "demo", "max_tokens": 8})
        final = poll_until_finished(tools.web_url, job["id"], timeout=60)
        assert final["status"] == "succeeded"

        def kinds() -> set[str]:
            return {
                e["type"] for e in seen if e.get("uuid") and e.get("type", "").startswith("task")
            }

        wait_for(lambda: "task-succeeded" in kinds(), 15, "the task-succeeded event")
        assert {"task-received", "task-started", "task-succeeded"} <= kinds()
        received = [e for e in seen if e.get("type") == "task-received"]
        assert any(
            e.get("name") == keys.GENERATE_TASK and job["id"] in e.get("args", "") for e in received
        )
    finally:
        tools.stop_workers()


def test_a_generate_task_that_names_no_job_is_dropped_and_the_worker_goes_on(
    tools: FaultStack,
) -> None:
    tools.worker("sturdy", ("demo",))
    try:
        app = celery_app(tools)
        for args in ([], [42], ["job_a", "job_b"]):
            app.send_task(keys.GENERATE_TASK, args=args, queue=keys.model_queue("demo"))
        job = submit(tools.web_url, {"prompt": "The", "model": "demo", "max_tokens": 4})
        final = poll_until_finished(tools.web_url, job["id"], timeout=30)
        assert final["status"] == "succeeded"
        log = (tools.log_dir / "sturdy.log").read_text()
        assert log.count("dropped a trickle.generate message that names no job") == 3
        inspect = app.control.inspect(timeout=5)
        wait_for(lambda: inspect.active() is not None, 15, "inspect active")
    finally:
        tools.stop_workers()
