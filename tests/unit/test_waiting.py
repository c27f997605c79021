"""The waiting estimate's logic: the order workers take queued jobs in, and when each starts."""

from __future__ import annotations

import pytest

from trickle.waiting import (
    QueuedEntry,
    WorkerOutlook,
    service_order,
    slots_free_in,
    start_times,
)


def entry(
    name: str, at: float, tenant_digest: str = "", priority: int = 0, tokens: int = 10
) -> QueuedEntry:
    return QueuedEntry(name, at, priority, tenant_digest, tokens)


def test_without_keys_jobs_are_taken_in_submission_order() -> None:
    order = service_order([entry("c", 3), entry("a", 1), entry("b", 2)])
    assert [e.job_id for e in order] == ["a", "b", "c"]


def test_interactive_jobs_go_before_batch_jobs_and_keys_take_turns() -> None:
    entries = [
        entry("a1", 1, "a"),
        entry("a2", 2, "a"),
        entry("a3", 3, "a"),
        entry("b1", 4, "b"),
        entry("late-batch", 0, "a", priority=9),
        entry("b2", 5, "b"),
    ]
    order = [e.job_id for e in service_order(entries)]
    assert order == ["a1", "b1", "a2", "b2", "a3", "late-batch"]


def test_each_job_takes_the_slot_that_frees_first() -> None:
    # Two slots: one frees in 1 s, one in 3 s; each job holds a slot 10 tokens x 0.1 s = 1 s.
    outlook = WorkerOutlook(at=100.0, free_in=(1.0, 3.0), seconds_per_token=0.1)
    order = [entry(name, i) for i, name in enumerate("abcd")]
    assert start_times(order, [outlook], now=100.0) == pytest.approx([1.0, 2.0, 3.0, 3.0])


def test_an_outlook_ages_and_the_length_ratio_shortens_a_job() -> None:
    outlook = WorkerOutlook(at=100.0, free_in=(2.0,), seconds_per_token=0.1, length_ratio=0.5)
    order = [entry("a", 1, tokens=20), entry("b", 2)]
    # Read 0.5 s after it was published: the slot frees in 1.5 s; "a" holds it 20 x 0.5 x 0.1.
    assert start_times(order, [outlook], now=100.5) == pytest.approx([1.5, 2.5])
    # Past its moment a slot is free now, never in the past.
    assert start_times(order[:1], [outlook], now=110.0) == [0.0]


def test_slots_of_several_workers_are_pooled_and_no_worker_means_unknown() -> None:
    one = WorkerOutlook(at=0.0, free_in=(4.0,), seconds_per_token=0.1)
    two = WorkerOutlook(at=0.0, free_in=(1.0,), seconds_per_token=0.3)
    starts = start_times([entry("a", 1), entry("b", 2)], [one, two], now=0.0)
    # The pace is the workers' median (0.2 s a token): "a" at 1 s, then "b" at 1 + 10 x 0.2.
    assert starts == pytest.approx([1.0, 3.0])
    assert start_times([entry("a", 1)], [], now=0.0) == [None]
    assert start_times([entry("a", 1)], [WorkerOutlook(0.0, (), 0.1)], now=0.0) == [None]


def test_a_worker_frees_its_slots_after_its_running_and_claimed_jobs() -> None:
    # Three slots: two rows free in 0.5 and 2 s, one slot is free now; two claimed jobs of
    # 10 tokens each wait for a lane and take the free slot, then the first to free.
    free, starts = slots_free_in([0.5, 2.0], [10, 10], slots=3, pace=0.1)
    assert free == pytest.approx([1.0, 1.5, 2.0])
    assert starts == pytest.approx([0.0, 0.5])  # the free slot, then the one freeing at 0.5 s
    assert slots_free_in([], [], slots=2, pace=0.0) == ([0.0, 0.0], [])
    assert slots_free_in([], [7], slots=0, pace=0.1) == ([], [0.0])


def test_an_outlook_round_trips() -> None:
    outlook = WorkerOutlook(12.5, (0.0, 1.25), 0.004, 0.5, (("job_a", 0.5), ("job_b", 1.0)))
    assert WorkerOutlook.from_json(outlook.to_json()) == outlook
    assert outlook.claims_seen_through == 12.5  # an older worker's: as of when it was made
    accounted = WorkerOutlook(12.5, (0.0,), 0.004, claims_through=12.25)
    assert WorkerOutlook.from_json(accounted.to_json()) == accounted
    assert accounted.claims_seen_through == 12.25
