"""The places batches hold while their messages are sent (web/batches/pending.py)."""

from __future__ import annotations

from web.batches.pending import PendingBatchJobs


def test_a_reservation_counts_until_released_and_only_for_its_key() -> None:
    pending = PendingBatchJobs()
    first = pending.reserve_within("a", {"m": 3}, {"m": 1}, limit=5)
    assert not isinstance(first, str)
    assert pending.reserve_within("a", {"m": 2}, {"m": 1}, limit=5) == "m"  # 1 + 3 + 2 > 5
    other = pending.reserve_within("b", {"m": 4}, {"m": 1}, limit=5)  # another key's own
    assert not isinstance(other, str)
    fan_out = first.hand_over()
    first.release()  # handed over: releases nothing
    assert pending.reserve_within("a", {"m": 2}, {"m": 1}, limit=5) == "m"
    fan_out()
    fan_out()  # once only
    again = pending.reserve_within("a", {"m": 2}, {"m": 1}, limit=5)
    assert not isinstance(again, str)
    assert pending.reserve_within("a", {"m": 1, "n": 9}, {"m": 0, "n": 0}, limit=5) == "n"
