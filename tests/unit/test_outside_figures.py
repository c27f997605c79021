"""The outside method's served tokens and the tokens/s its measured CPU allows (pure logic)."""

from __future__ import annotations

import pytest

from bench.outside import Arrival, ceilings, delivered_tokens


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
