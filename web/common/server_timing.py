"""Where an answer's time went, told to its client: ``Server-Timing`` on a whole answer, an SSE
comment at a stream's end (``trickle.hop_timings`` names the hops)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from flask import Response

from trickle.hop_timings import server_timing
from trickle.jobs import Job

SERVER_TIMING_HEADER = "Server-Timing"


def answer_hops(jobs: Sequence[Job], delivered: bool = True) -> dict[str, float]:
    """The hops of the job the answer waited on longest (the last to end, for several
    choices), in seconds; ``delivered``: this answer carried its end, so ``deliver`` (its end to
    now) is one of them."""
    if not jobs:
        return {}
    ended = [job for job in jobs if job.completed_at is not None]
    job = max(ended, key=lambda job: job.completed_at or 0.0) if ended else jobs[0]
    hops = job.hops()
    if delivered and job.completed_at is not None:
        hops["deliver"] = max(time.time() - job.completed_at, 0.0)
    return hops


def with_server_timing(response: Response, jobs: Sequence[Job], delivered: bool = True) -> Response:
    """``response`` with its ``Server-Timing`` header (none when no hop was reached yet)."""
    value = server_timing(answer_hops(jobs, delivered))
    if value:
        response.headers[SERVER_TIMING_HEADER] = value
    return response


def timing_comment(jobs: Sequence[Job]) -> str:
    """The hops as an SSE comment (``: server-timing <header value>``), for the end of an
    OpenAI or Anthropic stream: every SSE client skips comments, so unchanged clients read
    the stream as before."""
    value = server_timing(answer_hops(jobs))
    return f": server-timing {value}\n\n" if value else ""
