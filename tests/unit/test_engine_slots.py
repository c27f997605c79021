"""bench.engine_arrivals' policies (pure logic): which waiting jobs a free slot takes as a call."""

from __future__ import annotations

import threading

import pytest

from bench.harness.engine_slots import ArrivedJob, SlotPolicy, SlotPool, parse_policy


class GatedCall:
    """A fake engine call that holds each call until released, noting its jobs and overlap."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.started = threading.Semaphore(0)
        self.release = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._running = 0
        self.most_at_once = 0

    def __call__(self, batch: list[ArrivedJob]) -> None:
        with self._lock:
            self.batches.append([job.index for job in batch])
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        self.started.release()
        assert self.release.acquire(timeout=10)
        for job in batch:
            job.token_times.append(job.arrived + 0.001)
        with self._lock:
            self._running -= 1

    def wait_started(self, calls: int) -> None:
        for _ in range(calls):
            assert self.started.acquire(timeout=10), "a slot did not start a call"


def test_a_static_replica_takes_everything_that_queued_during_its_call() -> None:
    call = GatedCall()
    pool = SlotPool(parse_policy("static1"), call)
    jobs = [ArrivedJob(index) for index in range(4)]
    pool.submit(jobs[0])
    call.wait_started(1)
    for job in jobs[1:]:
        pool.submit(job)
    call.release.release()
    call.wait_started(1)
    call.release.release()
    pool.close()
    assert call.batches == [[0], [1, 2, 3]]
    assert pool.calls == [1, 3]
    assert all(job.started is not None and job.started >= job.arrived for job in jobs)


def test_one_call_per_arrival_runs_at_most_k_at_once_oldest_first() -> None:
    call = GatedCall()
    pool = SlotPool(parse_policy("call2"), call)
    for index in range(5):
        pool.submit(ArrivedJob(index))
    call.wait_started(2)
    for _ in range(5):
        call.release.release()
    pool.close()
    assert sorted(call.batches) == [[0], [1], [2], [3], [4]]
    assert {index for batch in call.batches[:2] for index in batch} == {0, 1}
    assert call.most_at_once == 2
    assert pool.calls == [1] * 5


def test_a_batch_limit_splits_the_queue_into_calls_of_that_size() -> None:
    call = GatedCall()
    pool = SlotPool(SlotPolicy("capped", 1, 2), call)
    pool.submit(ArrivedJob(0))
    call.wait_started(1)
    for index in range(1, 6):
        pool.submit(ArrivedJob(index))
    for _ in range(4):
        call.release.release()
    pool.close()
    assert call.batches == [[0], [1, 2], [3, 4], [5]]


def test_a_failed_call_is_raised_by_close_and_the_pool_refuses_more() -> None:
    def broken(_batch: list[ArrivedJob]) -> None:
        raise ValueError("engine down")

    pool = SlotPool(parse_policy("call1"), broken)
    pool.submit(ArrivedJob(0))
    with pytest.raises(RuntimeError, match="engine call failed") as caught:
        pool.close()
    assert isinstance(caught.value.__cause__, ValueError)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(ArrivedJob(1))


def test_policies_parse_from_their_names() -> None:
    assert parse_policy("static2") == SlotPolicy("static2", 2, 0)
    assert parse_policy("call8") == SlotPolicy("call8", 8, 1)
    assert "2 at once" in parse_policy("call2").describe()
    assert "everything waiting" in parse_policy("static1").describe()
    for bad in ("static", "call0", "batch2", "static-1", "call2x"):
        with pytest.raises(ValueError, match="static<R> or call<K>"):
            parse_policy(bad)
