"""The deadline index: jobs that carry a client's deadline, so one nobody claims still ends then.

A worker checks a job's deadline when it claims it, but a job in a queue no worker serves (or
one served slowly) would wait past its deadline, its readers told nothing. Each shard keeps a
sorted set of its jobs' deadlines (``keys.deadline_jobs``), written with the job's record, and
every worker's maintenance sweeps the entries that are due: a job still queued, unstarted, ends
``expired`` (``scripts.EXPIRE_AT_DEADLINE``, atomic with the claim). An entry leaves the index
when it is swept, whatever became of its job, so the index holds only the deadlines to come.

Reading 256 shards every tick would cost every worker a few hundred commands four times a
second, and sweeping them only every recovery interval ended jobs up to that late. So the same
deadlines also go to one key for all shards (``keys.deadlines_next``): a worker reads its first
entry each tick, one command, and sweeps the shards when it is due (and, in case one was lost,
every recovery interval). A reader waiting on a queued job ends it at its deadline itself
(``expire_late``), so it ends then even with no worker alive.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from trickle import keys
from trickle.events import DONE_MESSAGE
from trickle.job_result import NOT_STARTED_BY_DEADLINE
from trickle.jobs import Job
from trickle.store.script_runner import ScriptRunner, ending_keys

# Who waits for a deadline (a worker's sweep, a reader) wakes this long after it, so it finds
# it due: a monotonic timer and the wall clock the deadlines are in may differ by a little.
DEADLINE_SLACK_SECONDS = 0.003


def sweep_due(now: float, last: float, most: float) -> bool:
    """Whether to sweep every shard now: ``most`` seconds passed since the last such sweep (a
    deadline whose entry in ``keys.deadlines_next`` was lost still ends). Due entries of that
    index are expired between sweeps (``Deadlines.expire_next``)."""
    return now - last >= most


def next_check_in(now: float, soonest: float | None, last: float, least: float) -> float:
    """Seconds until the next look: at the earliest deadline not swept (or ``least`` after the
    last sweep, if later), so a job ends at its deadline, not up to a tick after it; never
    later than ``least`` from now (a deadline written meanwhile)."""
    if soonest is None:
        return least
    return max(min(max(soonest, last + least) - now, least), 0.0)


class Deadlines:
    """Index jobs by their client's deadline and expire those not started by then."""

    def __init__(self, runner: ScriptRunner, result_ttl_seconds: int):
        self._runner = runner
        self.result_ttl_seconds = result_ttl_seconds

    @staticmethod
    def queue_index(pipe: Any, job: Job) -> None:
        """Queue a new job's entry on ``pipe`` (a pipeline or a WriteRecorder), if it has a
        deadline: in the same transaction as its record, so no job is recorded without it."""
        if job.deadline is not None:
            pipe.zadd(keys.deadline_jobs(keys.shard_of(job.id)), {job.id: job.deadline})

    @staticmethod
    def queue_next(pipe: Any, jobs: Iterable[Job]) -> None:
        """Queue the jobs' deadlines on ``keys.deadlines_next`` (after their index entries: on a
        cluster it is another slot, so never in a job's own transaction or script)."""
        deadlines = {job.id: job.deadline for job in jobs if job.deadline is not None}
        if deadlines:
            pipe.zadd(keys.deadlines_next(), deadlines)

    @staticmethod
    def queue_unindex(pipe: Any, job_id: str) -> None:
        """Queue the removal of a job's entries (its record is taken back)."""
        pipe.zrem(keys.deadline_jobs(keys.shard_of(job_id)), job_id)
        pipe.zrem(keys.deadlines_next(), job_id)

    def soonest(self) -> float | None:
        """The earliest deadline not swept yet (unix seconds), None for none: one command."""
        first = self._runner.redis.zrange(keys.deadlines_next(), 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    def of(self, job_id: str) -> float | None:
        """A job's deadline (unix seconds) as its record holds it; None for none."""
        value = self._runner.redis.hget(keys.job(job_id), "deadline")
        return float(value) if value else None

    def expire_due(self, now: float) -> list[str]:
        """End every queued, unstarted job whose deadline is at or before ``now``; returns their
        ids. One pipelined read over the shards (which also drops the swept deadlines from
        ``keys.deadlines_next``), then one script call per due entry."""
        pipe = self._runner.pipeline()
        for shard in range(keys.SHARDS):
            pipe.zrangebyscore(keys.deadline_jobs(shard), "-inf", repr(now))
        # A deadline at or before ``now`` written after this read was written by a job created
        # after ``now``: none can be, a deadline being later than its job's creation.
        pipe.zremrangebyscore(keys.deadlines_next(), "-inf", repr(now))
        *due, _dropped = pipe.execute()
        return self._expire([str(job_id) for shard in due for job_id in shard], now)

    def expire_next(self, now: float) -> list[str]:
        """End the jobs whose entries in ``keys.deadlines_next`` are due, and drop those
        entries: a read of that one key, not of every shard (entries of jobs claimed or ended
        meanwhile cost one no-op script each). Workers racing here run the same script, so a
        job is expired once."""
        due = self._runner.redis.zrangebyscore(keys.deadlines_next(), "-inf", repr(now))
        if not due:
            return []
        ended = self._expire([str(job_id) for job_id in due], now)
        self._runner.redis.zrem(keys.deadlines_next(), *due)
        return ended

    def expire_late(self, job_id: str, deadline: float | None, now: float) -> bool:
        """End the job ``expired`` if it is still queued, unstarted, and its ``deadline`` is at
        or before ``now``: what a reader does for the job it waits on, so it ends at its
        deadline even with no worker alive to sweep. The same script as the sweep's, so a claim
        at the same moment either runs it or loses it, never both; True if this call ended it."""
        if deadline is None or deadline > now:
            return False
        return bool(self._expire([job_id], now))

    def _expire(self, job_ids: list[str], now: float) -> list[str]:
        """Run the expiry for each of ``job_ids`` (one pipeline); the ids it ended."""
        if not job_ids:
            return []
        error = json.dumps(NOT_STARTED_BY_DEADLINE.to_dict())
        runner = self._runner

        def build(pipe: Any) -> None:
            for job_id in job_ids:
                shard = keys.shard_of(job_id)
                runner.queue_script(
                    pipe,
                    "EXPIRE_AT_DEADLINE",
                    [
                        keys.job(job_id),
                        keys.deadline_jobs(shard),
                        keys.queued_jobs(shard),
                        *ending_keys(job_id),
                    ],
                    [
                        job_id,
                        repr(now),
                        error,
                        self.result_ttl_seconds,
                        runner.publish,
                        DONE_MESSAGE,
                    ],
                )

        replies = runner.execute(build)
        return [job_id for job_id, ended in zip(job_ids, replies, strict=True) if ended]
