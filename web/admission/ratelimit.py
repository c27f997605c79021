"""Per-key rate limits, requests and tokens per minute, through Flask-Limiter on Redis, reported
the way OpenAI reports them.

The caller is its tenant (a named key's own limits, or ``[rate_limits]`` where it sets none;
an ``[auth] api_keys`` entry, ``[rate_limits]``), or its address when no keys are configured.
Every request that costs work counts against ``requests_per_minute`` before its view runs:
each ``POST`` and ``DELETE`` (uploads, ``count_tokens``, cancels, and the requests refused
later for their content, whose refusal cost work too), and the reads marked ``@counted_read``
(lists, downloads). Tokens are reserved at submission as prompt tokens plus ``max_tokens``
(what the job may cost), as OpenAI counts them; a request refused for its tokens reserves none.

Every ``/v1`` answer to a limited caller carries ``x-ratelimit-{limit,remaining,reset}-requests``
and the same three for tokens (a limit that is 0, unlimited, sends none), read from the caller's
own counters: one key's budget never shows in another key's answers.

What Flask-Limiter cannot express, and how it is done instead: its ``@limit`` decorators check a
route before its view runs, while a request's token cost is known only once the view has
tokenized the prompt; and it reports limits as ``X-RateLimit-*`` of the one limit that was
checked, not OpenAI's pair of limits. So admission uses the Limiter's own storage and strategy
(``Limiter.limiter``, the ``limits`` library it configures from ``storage_uri``) directly, with
a cost, and the headers are written here. Its windows are fixed minutes that start at a
caller's first request (``fixed-window`` on Redis: a counter with a 60 s expiry).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from flask import Flask, Response, current_app, request
from flask_limiter import Limiter
from limits import RateLimitItem, RateLimitItemPerMinute

from trickle import keys
from trickle.config.sections import RateLimitSettings
from trickle.config.settings import Settings
from web.admission.auth import current_key, current_tenant_digest, route_access, stream_grant
from web.common.errors import too_many

COUNTED_READ = "trickle_counted_read"
# Methods that read one thing cheaply, uncounted unless their view is ``@counted_read``.
READS = frozenset({"GET", "HEAD", "OPTIONS"})
View = TypeVar("View", bound=Callable[..., object])


def counted_read(view: View) -> View:
    """Mark a read that costs work (a list, a download) as counted in requests_per_minute."""
    setattr(view, COUNTED_READ, True)
    return view


@dataclass(frozen=True)
class CallerLimits:
    """One caller's limits per minute (0: none) and the identifier of its counters."""

    subject: str
    requests_per_minute: int
    tokens_per_minute: int

    def items(self) -> dict[str, RateLimitItem]:
        amounts = {"requests": self.requests_per_minute, "tokens": self.tokens_per_minute}
        return {kind: RateLimitItemPerMinute(amount) for kind, amount in amounts.items() if amount}


def caller_limits(defaults: RateLimitSettings) -> CallerLimits | None:
    """The limits of the request's caller, None when it has none."""
    key = current_key()
    if key is not None:
        rpm = (
            defaults.requests_per_minute
            if key.requests_per_minute is None
            else key.requests_per_minute
        )
        tpm = defaults.tokens_per_minute if key.tokens_per_minute is None else key.tokens_per_minute
        subject = f"key:{key.name}"
    else:
        rpm, tpm = defaults.requests_per_minute, defaults.tokens_per_minute
        subject = current_tenant_digest() or f"addr:{request.remote_addr or 'unknown'}"
    if not (rpm or tpm):
        return None
    return CallerLimits(subject, rpm, tpm)


def any_limit(settings: Settings) -> bool:
    defaults = settings.rate_limits
    return bool(defaults.requests_per_minute or defaults.tokens_per_minute) or any(
        key.requests_per_minute or key.tokens_per_minute for key in settings.keys.values()
    )


class RateLimiter:
    """Admission's ``admit(tokens)`` and the headers, on a Flask-Limiter ``Limiter``."""

    def __init__(self, settings: Settings, storage_uri: str | None = None):
        """``storage_uri``: ``limits``' storage, Redis (``redis.url``) unless a test says
        ``memory://``."""
        self._defaults = settings.rate_limits
        self.enabled = any_limit(settings)
        uri = storage_uri or settings.redis.url
        # The Redis storage's own prefix (Flask-Limiter's key_prefix covers only its decorators).
        options: dict[str, str | int] = (
            {} if uri.startswith("memory://") else {"key_prefix": keys.RATE_LIMIT_PREFIX}
        )
        self._limiter = Limiter(
            key_func=lambda: "",  # never used: no route carries a decorator
            storage_uri=uri,
            storage_options=options,
            strategy="fixed-window",
            enabled=self.enabled,
            headers_enabled=False,
        )

    def install(self, app: Flask) -> None:
        """Bind the Limiter to the app (its storage) and add the headers to /v1 answers."""
        if not self.enabled:
            return  # no hook at all: an unlimited deployment pays nothing per request
        self._limiter.init_app(app)
        app.before_request(self.count_request)
        app.after_request(self.add_headers)

    def count_request(self) -> None:
        """Count the request against requests_per_minute before its view runs (429 past it),
        unless it is an uncounted read or no key's request (a probe, a stream token's)."""
        if route_access() != "api" or stream_grant():
            return
        view = current_app.view_functions.get(request.endpoint or "")
        if request.method in READS and not getattr(view, COUNTED_READ, False):
            return
        self._take({"requests": 1})

    def admit(self, tokens: int) -> None:
        """Reserve ``tokens`` against the caller's tokens_per_minute, or refuse with 429 (the
        request itself was counted when it arrived)."""
        self._take({"tokens": tokens})

    def _take(self, costs: dict[str, int]) -> None:
        """Count ``costs`` (per kind) against the caller's limits once all of them fit."""
        if not self.enabled:
            return
        limits = caller_limits(self._defaults)
        if limits is None:
            return
        strategy = self._limiter.limiter
        items = {kind: item for kind, item in limits.items().items() if kind in costs}
        for kind, item in items.items():
            if not strategy.test(item, limits.subject, kind, cost=costs[kind]):
                reset = strategy.get_window_stats(item, limits.subject, kind).reset_time
                retry_after = max(1, math.ceil(reset - time.time()))
                raise too_many(
                    "rate_limit_exceeded",
                    f"rate limit of {item.amount} {kind} per minute reached "
                    f"({kind}_per_minute); retry in {retry_after} s",
                    retry_after,
                )
        for kind, item in items.items():
            strategy.hit(item, limits.subject, kind, cost=costs[kind])

    def add_headers(self, response: Response) -> Response:
        if route_access() != "api" or stream_grant():
            return response
        if response.status_code == 401:
            return response  # refused before its key was known: nobody's budget
        limits = caller_limits(self._defaults)
        if limits is None:
            return response
        strategy = self._limiter.limiter
        now = time.time()
        for kind, item in limits.items().items():
            stats = strategy.get_window_stats(item, limits.subject, kind)
            response.headers[f"x-ratelimit-limit-{kind}"] = str(item.amount)
            response.headers[f"x-ratelimit-remaining-{kind}"] = str(max(stats.remaining, 0))
            response.headers[f"x-ratelimit-reset-{kind}"] = reset_text(stats.reset_time - now)
        return response


def reset_text(seconds: float) -> str:
    """OpenAI's duration format: ``1m5s``, ``20s``, ``250ms``."""
    seconds = max(seconds, 0.0)
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"
