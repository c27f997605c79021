"""Retrying Redis calls a worker cannot do without (claiming, reading, storing a job)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

log = logging.getLogger(__name__)
T = TypeVar("T")

TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def with_redis_retry(call: Callable[[], T], give_up_after: float, what: str) -> T:
    """Run ``call``, retrying with backoff while Redis is unreachable (it is coming back)."""
    deadline = time.monotonic() + give_up_after
    delay = 0.1
    while True:
        try:
            return call()
        except TRANSIENT as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s: redis unavailable (%s); retrying in %.1fs", what, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
