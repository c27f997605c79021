"""The dispatcher's token shares: a key served more than ``lag`` tokens beyond another key at
work waits (held, unacked, its queues paused) while the other key's jobs start; it goes on once
that key caught up or left, and nothing fails."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from tests.unit.test_dispatch_caps import FakeCaps, FakeRequest, wait
from worker.dispatch import JobDispatcher, QueueSwitches
from worker.fairness.token_shares import TokenShares
from worker.fairness.vtc import VirtualTokenCounter


@dataclass
class Params:
    max_tokens: int


@dataclass
class Usage:
    prompt_tokens: int


@dataclass
class FakeJob:
    params: Params
    usage: Usage = field(default_factory=lambda: Usage(0))


@dataclass
class FakeClaim:
    job: FakeJob
    claimed: bool = True
    logged_tokens: int = 0


MAX_TOKENS = {"a1": 100, "a2": 100, "a3": 100, "b1": 10, "b2": 10, "b3": 10, "b4": 10, "a4": 100}


def test_a_key_ahead_of_its_token_share_waits_for_the_key_behind() -> None:
    started: list[str] = []
    ends = {job_id: threading.Event() for job_id in MAX_TOKENS}

    def run_job(job_id: str, claim: Any) -> None:
        started.append(job_id)
        ends[job_id].wait(5)

    def claims(job_ids: list[str]) -> list[FakeClaim]:
        return [FakeClaim(FakeJob(Params(MAX_TOKENS[job_id]))) for job_id in job_ids]

    shares = TokenShares(VirtualTokenCounter(lag_tokens=100))
    switches = FakeCaps()  # only its pause/resume/hold recorders
    dispatcher = JobDispatcher(run_job, claims, slots=8, shares=shares)
    dispatcher.switches = QueueSwitches(switches.pause, switches.resume, switches.hold)
    dispatcher.start()
    requests = {job_id: FakeRequest(job_id) for job_id in MAX_TOKENS}

    def submit(job_id: str) -> None:
        dispatcher.submit(lambda r=requests[job_id]: r, job_id[0])  # type: ignore[misc]

    submit("a1")  # a alone: 200 weighted tokens
    wait(lambda: started == ["a1"], "a1 starts")
    submit("b1")  # b starts level with a (200), then 20 more
    wait(lambda: "b1" in started, "b1 starts")
    submit("a2")  # a: 200, 20 behind b: it starts (400)
    wait(lambda: "a2" in started, "a2 starts")
    submit("a3")  # a: 400, 180 ahead of b: it waits
    submit("b2")
    wait(lambda: "b2" in started, "b2 starts while a3 waits")
    assert "a3" not in started
    assert switches.switches == ["pause a"] and switches.held == 1
    assert shares.counter.counter("a") == 400 and shares.counter.counter("b") == 240
    ends["b1"].set()
    ends["b2"].set()  # b leaves: nobody to wait for
    wait(lambda: "a3" in started, "a3 starts once b has no work here")
    for event in ends.values():
        event.set()
    assert dispatcher.join(5)
    assert switches.switches == ["pause a", "resume a"] and switches.held == 0
    assert all(requests[job_id].acked for job_id in started)


def test_a_key_held_at_its_slots_still_holds_back_a_key_ahead_of_it() -> None:
    """B has as many jobs here as ``key_slots`` (its next one held): those fill the rows A's job
    would take, so A, ahead of B, still waits (leaving B out as a held key let A in)."""
    started: list[str] = []
    ends = {job_id: threading.Event() for job_id in MAX_TOKENS}

    def run_job(job_id: str, claim: Any) -> None:
        started.append(job_id)
        ends[job_id].wait(5)

    def claims(job_ids: list[str]) -> list[FakeClaim]:
        return [FakeClaim(FakeJob(Params(MAX_TOKENS[job_id]))) for job_id in job_ids]

    shares = TokenShares(VirtualTokenCounter(lag_tokens=100))
    switches = FakeCaps()
    dispatcher = JobDispatcher(run_job, claims, slots=8, key_slots=3, shares=shares)
    dispatcher.switches = QueueSwitches(switches.pause, switches.resume, switches.hold)
    dispatcher.start()
    requests = {job_id: FakeRequest(job_id) for job_id in MAX_TOKENS}
    for job_id in ("a1", "b1", "a2", "b2", "b3"):
        dispatcher.submit(lambda r=requests[job_id]: r, job_id[0])  # type: ignore[misc]
        wait(lambda job_id=job_id: job_id in started, f"{job_id} starts")  # type: ignore[misc]
    # a: 400 (2 jobs of its 3 slots), b: 260 and at its 3 slots: b's fourth job is held, then
    # a3 (a 140 ahead) too.
    dispatcher.submit(lambda: requests["b4"], "b")  # type: ignore[arg-type, return-value]
    wait(lambda: switches.held == 1, "b4 held at b's key_slots")
    dispatcher.submit(lambda: requests["a3"], "a")  # type: ignore[arg-type, return-value]
    wait(lambda: switches.held == 2, "a3 held behind b")
    assert "a3" not in started
    ends["b1"].set()
    wait(lambda: "b4" in started, "b4 takes b1's slot")
    assert "a3" not in started
    for event in ends.values():
        event.set()
    wait(lambda: "a3" in started, "a3 starts once b has no work here")
    assert dispatcher.join(5)
    assert all(requests[job_id].acked for job_id in started)


def test_a_key_with_nothing_more_to_run_holds_nobody_back() -> None:
    """B has one job at work and nothing queued: A, far ahead, still starts (its rows would
    idle otherwise); once B has a backlog, A waits for it."""
    started: list[str] = []
    ends = {job_id: threading.Event() for job_id in MAX_TOKENS}
    backlog = {"b": False}

    def run_job(job_id: str, claim: Any) -> None:
        started.append(job_id)
        ends[job_id].wait(5)

    def claims(job_ids: list[str]) -> list[FakeClaim]:
        return [FakeClaim(FakeJob(Params(MAX_TOKENS[job_id]))) for job_id in job_ids]

    shares = TokenShares(VirtualTokenCounter(lag_tokens=100), lambda tenant: backlog[tenant])
    switches = FakeCaps()
    dispatcher = JobDispatcher(run_job, claims, slots=8, shares=shares)
    dispatcher.switches = QueueSwitches(switches.pause, switches.resume, switches.hold)
    dispatcher.start()
    requests = {job_id: FakeRequest(job_id) for job_id in MAX_TOKENS}
    for job_id in ("a1", "b1", "a2", "a3"):  # a3: a 180 ahead of b, whose queue is empty
        dispatcher.submit(lambda r=requests[job_id]: r, job_id[0])  # type: ignore[misc]
        wait(lambda job_id=job_id: job_id in started, f"{job_id} starts")  # type: ignore[misc]
    backlog["b"] = True
    dispatcher.submit(lambda: requests["a4"], "a")  # type: ignore[arg-type, return-value]
    wait(lambda: switches.held == 1, "a's next job waits for b's backlog")
    assert "a4" not in started
    for event in ends.values():
        event.set()
    wait(lambda: "a4" in started, "a4 starts once b has no work here")
    assert dispatcher.join(5)
    assert all(requests[job_id].acked for job_id in started)
