"""KeyCaps on a real Redis: a key's running set admits up to its cap, counts a redelivered job
once, and frees a slot when a job ends or its entry lapses."""

from __future__ import annotations

import time

import redis

from trickle import keys
from trickle.tenants import TenantTable, build_keys
from worker.fairness.key_caps import KeyCaps


def test_the_cap_is_shared_and_lapses(private_redis: redis.Redis) -> None:
    private_redis.flushdb()
    table = TenantTable(build_keys({"a": {"key": "ka", "max_running_jobs": 2}, "b": {"key": "kb"}}))
    first, second = KeyCaps(private_redis, table, 60), KeyCaps(private_redis, table, 60)
    assert first.capped("a") and not first.capped("b") and not first.capped("")
    assert first.take("a", ["j1"]) == {"j1"}
    assert second.take("a", ["j2", "j3"]) == {"j2"}  # another worker, the same count
    assert second.take("a", ["j1", "j3"]) == {"j1"}  # a redelivered j1 is already counted
    first.release("a", "j1")
    assert second.take("a", ["j3"]) == {"j3"}
    assert private_redis.zcard(keys.key_running("a")) == 2
    lapsing = KeyCaps(private_redis, table, 0.05)
    private_redis.delete(keys.key_running("a"))
    assert lapsing.take("a", ["j4", "j5"]) == {"j4", "j5"}
    time.sleep(0.1)  # a dead worker's entries lapse
    assert lapsing.take("a", ["j6"]) == {"j6"}
