"""The outside method's served tokens and the tokens/s its measured CPU allows (pure logic)."""

from __future__ import annotations

import pytest

from bench.outside import Arrival, ceilings, client_waits, delivered_tokens


def test_a_stream_counts_its_own_tokens_not_its_chunks() -> None:
    paced = Arrival(token_times=[1.0, 1.1, 1.2], tokens=128)  # three chunks, 128 tokens
    assert delivered_tokens([paced]) == 128


def test_a_stream_without_usage_counts_its_chunks_and_a_failed_one_nothing() -> None:
    no_usage = Arrival(token_times=[1.0, 1.1])
    failed = Arrival(token_times=[1.0], tokens=5, error="ReadError")
    assert delivered_tokens([no_usage, failed]) == 2


def test_the_ceilings_divide_the_cores_by_each_token_s_cpu() -> None:
    cpu_us = {"web": 100.0, "worker": 100.0, "engine": 300.0, "redis": 0.0, "client": 500.0}
    found = ceilings(cpu_us, engine_alone_us=250.0, cores=2)
    assert found["all_on_these_cores"] == pytest.approx(2e6 / 1000)
    assert found["client_elsewhere"] == pytest.approx(2e6 / 500)
    assert found["engine_alone_and_client"] == pytest.approx(2e6 / 750, abs=1)


def test_no_cpu_measured_gives_no_ceiling() -> None:
    assert ceilings({}, engine_alone_us=0.0, cores=2)["all_on_these_cores"] == 0.0


def test_the_clients_own_waits_split_at_its_task_start_and_its_first_network_step() -> None:
    """Due at 10.0 s, its task ran at 10.5 s, its connect started at 12.0 s: 500 ms of the
    client's loop, then 1,500 ms in its pool; a request never sent has no waits."""
    held = Arrival(due_at=10.0, sent_at=10.5, trace=[("connection.connect_tcp.started", 12.0)])
    assert held.client_wait_ms == pytest.approx((500.0, 1500.0))
    assert Arrival(due_at=1.0, sent_at=1.0).client_wait_ms is None
    prompt = Arrival(due_at=0.0, sent_at=0.0, trace=[("http11.send_request_headers.started", 0.0)])
    waits = client_waits([held, prompt, Arrival()])
    assert waits["to_network"]["p99"] == pytest.approx(1500.0 * 0.99, rel=0.01)
    assert waits["task_start"]["p50"] == pytest.approx(250.0)
