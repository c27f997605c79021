"""A streamed request with an Idempotency-Key outlives its client for a grace period.

A client whose stream drops retries the same request with the same key; the retry gets the
first request's jobs and re-attaches to them: it replays from the first token and follows
to the end. That only works if the jobs are still running, so a keyed stream whose client
leaves does not cancel its jobs at once (a stream without a key does: nobody can come back
for it). Instead:

- while it reads, each keyed stream counts itself in each job's readers hash (``attached``);
- a stream whose client left writes when (``left_at``) and arms a timer for
  ``web.stream_resume_grace_seconds``;
- when the timer fires, a job nobody is attached to, whose last reader left at least the
  grace ago, is canceled; a retry that re-attached in time keeps it.

A retry that finds the jobs canceled (the grace ran out, or someone canceled them) answers
409 ``request_canceled`` instead of replaying a cut stream (web/openai/routes.py).

The timer lives in the web process whose client left: should that process die within the
grace, the job runs to its end instead, and its whole output waits for the retry. A job is
never canceled while a reader is attached, except in the moment between the timer's read and
its cancel (a retry attaching then gets the canceled job's error event, never a cut stream
reported complete).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import redis

from trickle import keys
from trickle.jobs import Job
from web.admission.submission import cancel_many
from web.services import Services

log = logging.getLogger(__name__)

ATTACHED = "attached"
LEFT_AT = "left_at"


def grace_seconds(svc: Services) -> float:
    return max(svc.settings.web.stream_resume_grace_seconds, 0.0)


def attach(svc: Services, jobs: Sequence[Job]) -> None:
    """Count one more keyed reader on each job (it then outlives a reader that leaves)."""
    ttl = svc.settings.limits.queued_ttl_seconds + svc.settings.limits.result_ttl_seconds
    pipe = svc.redis.pipeline(transaction=False)
    for job in jobs:
        name = keys.job_readers(job.id)
        pipe.hincrby(name, ATTACHED, 1)
        pipe.expire(name, ttl)
    pipe.execute()


def detach(svc: Services, jobs: Sequence[Job], unfinished: Sequence[Job], left: bool) -> None:
    """One keyed reader of ``jobs`` stops; ``left``: its client went away, so ``unfinished``
    jobs are canceled after the grace unless a retry re-attaches meanwhile."""
    now = time.time()
    pipe = svc.redis.pipeline(transaction=False)
    for job in jobs:
        name = keys.job_readers(job.id)
        pipe.hincrby(name, ATTACHED, -1)
        if left:
            pipe.hset(name, LEFT_AT, repr(now))
    pipe.execute()
    if left and unfinished:
        timer = threading.Timer(grace_seconds(svc), expire, args=(svc, list(unfinished)))
        timer.daemon = True
        timer.start()


def expire(svc: Services, jobs: Sequence[Job], now: float | None = None) -> list[Job]:
    """Cancel those of ``jobs`` that no reader re-attached to within the grace; returns them."""
    now = time.time() if now is None else now
    grace = grace_seconds(svc)
    try:
        pipe = svc.redis.pipeline(transaction=False)
        for job in jobs:
            pipe.hmget(keys.job_readers(job.id), [ATTACHED, LEFT_AT])
        readings = pipe.execute()
        abandoned = [
            job
            for job, (attached, left_at) in zip(jobs, readings, strict=True)
            if int(attached or 0) <= 0 and now - float(left_at or 0) >= grace - 0.05
        ]
        if abandoned:
            log.info("no retry re-attached within %.1f s: canceling %s", grace, abandoned[0].id)
            cancel_many(svc, [(job.id, job.model) for job in abandoned])
        return abandoned
    except redis.RedisError as exc:  # left running: it ends by itself, nothing is lost
        log.warning("could not cancel abandoned jobs %s: %s", ", ".join(j.id for j in jobs), exc)
        return []
    except Exception:  # the edge of a timer thread: nobody else would see it
        log.exception("canceling abandoned jobs failed")
        return []
