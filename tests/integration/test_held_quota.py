"""A hold that draws from another holder (``HeldQuota.hold``'s ``drawing_from``): the bytes
the other holds move over in the same script call, so only the rest is new room, and nobody
can take the room between (a batch's output room handed to the files written from it). On
the test Redis."""

from __future__ import annotations

import secrets
import time

import pytest
import redis

from trickle.store.held_quota import HeldQuota, QuotaFull

LIMIT = 1_000


@pytest.fixture
def quota(redis_client: redis.Redis) -> HeldQuota:
    tag = secrets.token_hex(8)
    return HeldQuota(redis_client, f"test:held:{tag}", f"test:held-bytes:{tag}", LIMIT, 10)


def _holds(quota: HeldQuota) -> dict[str, int]:
    return {name: int(value) for name, value in quota.redis.hgetall(quota.keys[1]).items()}


def test_a_hold_drawn_from_another_moves_its_bytes_and_takes_only_the_rest(
    quota: HeldQuota,
) -> None:
    later = time.time() + 600
    quota.hold("batch", 900, later)
    assert quota.hold("file", 600, later, drawing_from="batch") == 900  # moved, not added
    assert _holds(quota) == {"batch": 300, "file": 600}
    with pytest.raises(QuotaFull):  # 300 move, 200 would be new: past the limit
        quota.hold("file", 500, later, drawing_from="batch")
    assert _holds(quota) == {"batch": 300, "file": 600}  # a refusal moves nothing
    assert quota.hold("file", 500, later, enforce=False, drawing_from="batch") == 1_100
    assert _holds(quota) == {"batch": 0, "file": 1_100}


def test_a_hold_drawn_from_a_holder_gone_is_new_room(quota: HeldQuota) -> None:
    later = time.time() + 600
    quota.hold("batch", 400, later)
    quota.release("batch")
    with pytest.raises(QuotaFull):
        quota.hold("file", LIMIT + 1, later, drawing_from="batch")
    assert quota.hold("file", 700, later, drawing_from="batch") == 700
    assert _holds(quota) == {"file": 700}


def test_bytes_given_back_once_per_mark_in_the_step_that_sets_it(quota: HeldQuota) -> None:
    """Settling a batch's lines: each line's bytes come back once, however many passes
    settle it, and never from a hold dropped meanwhile (nor recreating it)."""
    later = time.time() + 600
    marks = f"{quota.keys[0]}:marks"
    quota.hold("batch", 900, later)
    assert quota.give_back_once("batch", marks, {0: 100, 1: 50}, 60) == 150
    assert quota.give_back_once("batch", marks, {1: 50, 2: 25}, 60) == 25  # line 1 was settled
    assert _holds(quota) == {"batch": 725}
    assert [quota.redis.getbit(marks, mark) for mark in range(4)] == [1, 1, 1, 0]
    assert 0 < quota.redis.ttl(marks) <= 60
    assert quota.give_back_once("batch", marks, {3: 5_000}, 60) == 725  # never below zero
    quota.release("batch")
    assert quota.give_back_once("batch", marks, {4: 10}, 60) == 0
    assert _holds(quota) == {}
