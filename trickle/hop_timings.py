"""A job's latency budget over its hops, read from the moments its record already holds.

The hops tile the wait a person feels, from the request's arrival at the web tier to the first
token, with nothing between them and nothing counted twice, so they add up to the job's time to
first token; ``generate`` and ``deliver`` follow on to the answer:

- ``admit``: arrival to the job's record being made (body, key, tokenizing, validation);
- ``queue``: from then to a worker's claim (limits, store, broker, dispatch), or, for a job
  that ended unclaimed (expired at its deadline, canceled or timed out in the queue), to its end;
- ``claim``: the claim's round trip to Redis;
- ``prefill``: claimed to the first token (engine hand-off, batch wait, first step);
- ``generate``: first token to the stored result;
- ``deliver``: stored result to the answer leaving the web tier (only for a request that waited
  for the job's end: a later poll did not deliver it).

Every moment is one the web tier or the worker already writes into the job's hash (the worker's
``claimed_at`` travels with its final write), so timing a job adds no round trip to its path.
"""

from __future__ import annotations

from collections.abc import Mapping

HOPS = ("admit", "queue", "claim", "prefill", "generate", "deliver")
# The hops before the first token: their sum is the job's time to first token.
FIRST_TOKEN_HOPS = HOPS[:4]


def hop_seconds(
    arrived_at: float | None,
    created_at: float,
    started_at: float | None,
    claimed_at: float | None,
    first_token_at: float | None,
    completed_at: float | None,
) -> dict[str, float]:
    """The hops a job went through (in order), in seconds; a hop whose end or start was never
    reached is left out. A hop never counts below zero (a resumed job's clocks can overlap)."""
    moments = (
        ("admit", arrived_at, created_at),
        ("queue", created_at, started_at),
        ("claim", started_at, claimed_at),
        ("prefill", claimed_at, first_token_at),
        ("generate", first_token_at, completed_at),
    )
    return {
        name: max(end - start, 0.0)
        for name, start, end in moments
        if start is not None and end is not None
    }


def timings_ms(hops: Mapping[str, float]) -> dict[str, float]:
    """Hops in milliseconds (three decimals), the unit ``Server-Timing`` and job objects use."""
    return {name: round(seconds * 1000, 3) for name, seconds in hops.items()}


def server_timing(hops: Mapping[str, float]) -> str:
    """The ``Server-Timing`` header value (W3C: ``name;dur=<ms>``, comma-separated)."""
    return ", ".join(f"{name};dur={ms:.3f}" for name, ms in timings_ms(hops).items())
