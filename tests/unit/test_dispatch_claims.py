"""Where the dispatcher claims: on the consumer's thread when the worker is idle (a lone job
spares a thread's wake-up), on the claim thread, many at once, when it is not (a burst)."""

from __future__ import annotations

import threading
from typing import Any

from tests.unit.test_dispatch_caps import FakeRequest, wait
from worker.dispatch import JobDispatcher


def test_an_idle_worker_claims_on_the_consumers_thread_and_a_busy_one_on_the_claim_thread() -> None:
    claimed_on: list[tuple[list[str], str]] = []
    ends = {job_id: threading.Event() for job_id in ("j1", "j2", "j3")}
    ran: list[str] = []

    def claim_many(job_ids: list[str]) -> list[Any]:
        claimed_on.append((job_ids, threading.current_thread().name))
        return [None] * len(job_ids)

    def run_job(job_id: str, claim: Any) -> None:
        ran.append(job_id)
        ends[job_id].wait(5)

    dispatcher = JobDispatcher(run_job, claim_many, slots=4)
    dispatcher.start()
    consumer = threading.current_thread().name
    try:
        dispatcher.submit(lambda: FakeRequest("j1"))  # type: ignore[arg-type,return-value]
        assert claimed_on == [(["j1"], consumer)]  # claimed before submit returned
        wait(lambda: ran == ["j1"], "j1 runs")
        dispatcher.submit(lambda: FakeRequest("j2"))  # type: ignore[arg-type,return-value]
        dispatcher.submit(lambda: FakeRequest("j3"))  # type: ignore[arg-type,return-value]
        wait(lambda: sorted(ran) == ["j1", "j2", "j3"], "j2 and j3 run")
        later = [name for _, name in claimed_on[1:]]
        assert later and set(later) == {"trickle-claim"}
        assert sorted(job for ids, _ in claimed_on[1:] for job in ids) == ["j2", "j3"]
    finally:
        for end in ends.values():
            end.set()
        assert dispatcher.join(5)


def test_a_claim_that_raises_leaves_each_job_to_claim_its_own() -> None:
    claims: list[Any] = []

    def claim_many(job_ids: list[str]) -> list[Any]:
        raise RuntimeError("a reply nobody expected")

    dispatcher = JobDispatcher(lambda job_id, claim: claims.append(claim), claim_many, slots=2)
    dispatcher.start()
    dispatcher.submit(lambda: FakeRequest("j1"))  # type: ignore[arg-type,return-value]
    wait(lambda: claims == [None], "the job thread got no claim: it claims its own")
    assert dispatcher.join(5)
