"""Per-key rate limits: requests and tokens per minute, in fixed one-minute windows in Redis.

The subject is the caller's API key digest, or its address when no keys are configured. Tokens
are reserved at submission as prompt tokens plus ``max_tokens`` (what the job may cost), the way
OpenAI counts against a limit. A refused request reserves nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
from flask import request

from web.auth import current_owner
from web.errors import too_many
from worker import keys
from worker.config import RateLimitSettings

WINDOW_SECONDS = 60

# KEYS: request counter, token counter   ARGV: tokens, rpm, tpm, ttl
_ADMIT = """
local requests = tonumber(redis.call('GET', KEYS[1]) or '0')
local tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
local rpm = tonumber(ARGV[2])
local tpm = tonumber(ARGV[3])
if rpm > 0 and requests + 1 > rpm then return 'requests' end
if tpm > 0 and tokens + tonumber(ARGV[1]) > tpm then return 'tokens' end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('INCRBY', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 'ok'
"""


class RateLimiter:
    def __init__(
        self,
        client: redis.Redis,
        limits: RateLimitSettings,
        clock: Callable[[], float] = time.time,
    ):
        """``clock`` (unix seconds) picks the window; tests pass their own to own the minute."""
        self._limits = limits
        self._clock = clock
        self._admit = client.register_script(_ADMIT)

    @property
    def enabled(self) -> bool:
        return bool(self._limits.requests_per_minute or self._limits.tokens_per_minute)

    def admit(self, tokens: int) -> None:
        """Count one request costing ``tokens`` against the caller, or refuse it with 429."""
        if not self.enabled:
            return
        subject = current_owner() or f"addr-{request.remote_addr or 'unknown'}"
        now = self._clock()
        window = int(now // WINDOW_SECONDS)
        verdict = self._admit(
            keys=[
                keys.rate_window(subject, "requests", window),
                keys.rate_window(subject, "tokens", window),
            ],
            args=[
                tokens,
                self._limits.requests_per_minute,
                self._limits.tokens_per_minute,
                2 * WINDOW_SECONDS,
            ],
        )
        if verdict != "ok":
            retry_after = max(1, int((window + 1) * WINDOW_SECONDS - now) + 1)
            limit = (
                f"{self._limits.requests_per_minute} requests"
                if verdict == "requests"
                else f"{self._limits.tokens_per_minute} tokens"
            )
            raise too_many(
                "rate_limit_exceeded",
                f"rate limit of {limit} per minute reached; retry in {retry_after} s",
                retry_after,
            )
