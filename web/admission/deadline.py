"""A job's deadline, as its client gives it: ``Cancel-After`` (Replicate's header, a duration
counted from the request's arrival) on any job-creating route, or ``deadline`` (unix seconds)
in a native job's body. A job not started by then is not run (it ends ``expired``); one still
running then is stopped with what it made (``finish_reason: deadline``). A batch's jobs keep
their batch's window instead: the batch routes never read either."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from flask import request

from trickle.jobs import Job
from web.common.arrival import arrival_time
from web.common.errors import HttpError, invalid

CANCEL_AFTER_HEADER = "Cancel-After"
# Go's duration syntax, as Replicate takes it: one or more <number><unit>, e.g. 1m30s, 500ms.
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")
_DURATION = re.compile(rf"(?:{_PART.pattern})+")
# Past this a deadline means nothing a queue would honour (a typo: "30h" for "30s"?).
MAX_SECONDS = 7 * 24 * 3600


def parse_duration(value: str) -> float:
    """Seconds in a Go-style duration (``30s``, ``1m30s``, ``500ms``); ValueError otherwise."""
    text = value.strip()
    if not _DURATION.fullmatch(text):
        raise ValueError(
            f"{CANCEL_AFTER_HEADER} must be a duration such as 30s, 1m30s or 500ms (units h, m, "
            f"s, ms, us, ns), got {value[:40]!r}"
        )
    seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(text))
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(
            f"{CANCEL_AFTER_HEADER} must be more than 0 and at most 7 days, got {value[:40]!r}"
        )
    return seconds


def request_deadline(body_deadline: float | None = None) -> float | None:
    """This request's deadline (unix seconds): the earlier of its ``Cancel-After`` and its
    body's ``deadline``; None without either. A malformed one, or one already past, is a 400
    naming it."""
    deadlines: list[float] = []
    header = request.headers.get(CANCEL_AFTER_HEADER)
    if header is not None:
        try:
            seconds = parse_duration(header)
        except ValueError as exc:
            raise invalid(CANCEL_AFTER_HEADER, str(exc)) from None
        deadlines.append((arrival_time() or time.time()) + seconds)
    if body_deadline is not None:
        if body_deadline <= time.time():
            raise invalid(
                "deadline",
                f"deadline ({body_deadline!r}, unix seconds) has already passed: the job "
                "could never start",
            )
        deadlines.append(body_deadline)
    return min(deadlines) if deadlines else None


def with_deadline(jobs: Sequence[Job], body_deadline: float | None = None) -> None:
    """Give every job of this request its deadline (read before anything is stored)."""
    deadline = request_deadline(body_deadline)
    for job in jobs:
        job.deadline = deadline


def expired_error(job: Job) -> HttpError:
    """The answer to a request whose job expired: never run, since its deadline came first."""
    return HttpError(
        504,
        "timeout",
        f"job {job.id} was not started before its deadline ({CANCEL_AFTER_HEADER} or "
        "deadline): it was not run",
        CANCEL_AFTER_HEADER,
        code="deadline_exceeded",
    )
