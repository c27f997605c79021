"""The dispatcher under max_running_jobs: a job over its key's cap waits (held, unacked, its
key's queues paused), another key's job starts at once, and nothing fails."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from worker.dispatch import JobDispatcher, QueueSwitches, queue_switches


class FakeRequest:
    def __init__(self, job_id: str):
        self.id = job_id
        self.args = [job_id]
        self.acked = False

    def on_accepted(self, *_: Any) -> None:
        pass

    def send_event(self, *_: Any, **__: Any) -> None:
        pass

    def acknowledge(self) -> None:
        self.acked = True


class FakeCaps:
    """KeyCaps in memory: tenant "a" may run one job at a time."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.switches: list[str] = []
        self.held = 0
        self.lock = threading.Lock()

    def capped(self, tenant: str) -> bool:
        return tenant == "a"

    def take(self, tenant: str, job_ids: list[str]) -> set[str]:
        with self.lock:
            admitted = {job_id for job_id in job_ids if job_id in self.running}
            for job_id in job_ids:
                if not self.running:
                    self.running.add(job_id)
                    admitted.add(job_id)
            return admitted

    def release(self, tenant: str, job_id: str) -> None:
        with self.lock:
            self.running.discard(job_id)

    def pause(self, tenant: str) -> None:
        self.switches.append(f"pause {tenant}")

    def resume(self, tenant: str) -> None:
        self.switches.append(f"resume {tenant}")

    def hold(self, count: int) -> None:
        self.held += count


def wait(predicate: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_job_over_its_keys_cap_waits_and_another_key_passes() -> None:
    started: list[str] = []
    ends = {job_id: threading.Event() for job_id in ("a1", "a2", "a3", "b1")}

    def run_job(job_id: str, claim: Any) -> None:
        started.append(job_id)
        ends[job_id].wait(5)

    caps = FakeCaps()
    dispatcher = JobDispatcher(
        run_job,
        lambda ids: [None] * len(ids),
        slots=8,
        caps=caps,  # type: ignore[arg-type]
    )
    dispatcher.switches = QueueSwitches(caps.pause, caps.resume, caps.hold)
    dispatcher.start()
    requests = {job_id: FakeRequest(job_id) for job_id in ends}
    for job_id in ("a1", "a2", "a3", "b1"):
        dispatcher.submit(lambda r=requests[job_id]: r, job_id[0])  # type: ignore[misc]
    wait(lambda: set(started) == {"a1", "b1"}, "a1 and b1 start, a2 and a3 wait")
    assert caps.switches == ["pause a"] and caps.held == 2
    ends["b1"].set()
    ends["a1"].set()
    wait(lambda: "a2" in started, "a2 starts once a1 ended")
    assert "a3" not in started and caps.held == 1
    ends["a2"].set()
    wait(lambda: "a3" in started, "a3 starts once a2 ended")
    ends["a3"].set()
    assert dispatcher.join(5)
    assert caps.switches == ["pause a", "resume a"] and caps.held == 0
    assert all(request.acked for request in requests.values())
    assert started == ["a1", "b1", "a2", "a3"] or started == ["b1", "a1", "a2", "a3"]


def test_no_key_takes_more_than_key_slots_and_another_key_still_starts() -> None:
    """With named keys a worker's window holds a reserve lane's batch more than its lanes: a
    flood of one key stops at ``key_slots`` (held, its queues paused), so the window always
    has room for another key's job."""
    started: list[str] = []
    ends = {job_id: threading.Event() for job_id in ("a1", "a2", "a3", "a4", "b1")}

    def run_job(job_id: str, claim: Any) -> None:
        started.append(job_id)
        ends[job_id].wait(5)

    switches = FakeCaps()  # only its pause/resume/hold recorders
    dispatcher = JobDispatcher(run_job, lambda ids: [None] * len(ids), slots=4, key_slots=2)
    dispatcher.switches = QueueSwitches(switches.pause, switches.resume, switches.hold)
    dispatcher.start()
    requests = {job_id: FakeRequest(job_id) for job_id in ends}
    for job_id in ("a1", "a2", "a3", "a4"):
        dispatcher.submit(lambda r=requests[job_id]: r, "a")  # type: ignore[misc]
    wait(lambda: set(started) == {"a1", "a2"}, "a1 and a2 start, a3 and a4 are held")
    assert switches.switches == ["pause a"] and switches.held == 2
    dispatcher.submit(lambda: requests["b1"], "b")  # type: ignore[arg-type, return-value]
    wait(lambda: "b1" in started, "b1 starts beside a's two")
    assert "a3" not in started
    ends["a1"].set()
    wait(lambda: "a3" in started, "a3 starts once a1 ended")
    assert "a4" not in started and switches.held == 1
    for job_id in ("a2", "a3", "a4", "b1"):
        ends[job_id].set()
    wait(lambda: "a4" in started, "a4 starts once a2 ended")
    assert dispatcher.join(5)
    assert switches.switches == ["pause a", "resume a"] and switches.held == 0
    assert all(request.acked for request in requests.values())


class FakeConsumer:
    """Celery's consumer as the switches use it; ``call_soon`` callbacks wait in a set, as in
    kombu's hub, and run in an order of the test's choosing."""

    def __init__(self) -> None:
        self.soon: list[Any] = []
        self.consuming = {"trickle.demo.key.a"}
        self.task_consumer = self

    def consuming_from(self, name: str) -> bool:
        return name in self.consuming

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.soon.append(lambda: callback(*args))

    def cancel_task_queue(self, name: str) -> None:
        self.consuming.discard(name)

    def add_task_queue(self, name: str) -> None:
        self.consuming.add(name)

    def run_soon(self, reverse: bool) -> None:
        callbacks, self.soon = self.soon, []
        for callback in reversed(callbacks) if reverse else callbacks:
            callback()


class OneQueue:
    def of_key(self, tenant: str) -> list[str]:
        return [f"trickle.demo.key.{tenant}"]


@pytest.mark.parametrize("reverse", [False, True])
def test_a_pause_and_the_resume_after_it_leave_the_queue_consumed_in_either_order(
    reverse: bool,
) -> None:
    """kombu's hub keeps call_soon callbacks in a set: a resume could run before the pause
    queued ahead of it, and the key's queue stayed paused with nothing held (its backlog was
    never read again)."""
    consumer = FakeConsumer()
    switches = queue_switches(consumer, OneQueue())  # type: ignore[arg-type]
    switches.pause("a")
    switches.resume("a")
    consumer.run_soon(reverse)
    assert consumer.consuming == {"trickle.demo.key.a"}
    switches.pause("a")
    consumer.run_soon(reverse)
    assert consumer.consuming == set()
