"""The deadline index: jobs that carry a client's deadline, so one nobody claims still ends then.

A worker checks a job's deadline when it claims it, but a job in a queue no worker serves (or
one served slowly) would wait past its deadline, its readers told nothing. Each shard keeps a
sorted set of its jobs' deadlines (``keys.deadline_jobs``), written with the job's record, and
every worker's maintenance sweeps the entries that are due: a job still queued, unstarted, ends
``expired`` (``scripts.EXPIRE_AT_DEADLINE``, atomic with the claim). An entry leaves the index
when it is swept, whatever became of its job, so the index holds only the deadlines to come.
"""

from __future__ import annotations

import json
from typing import Any

from trickle import keys
from trickle.events import DONE_MESSAGE
from trickle.jobs import NOT_STARTED_BY_DEADLINE, Job
from trickle.store.script_runner import ScriptRunner, ending_keys


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
    def queue_unindex(pipe: Any, job_id: str) -> None:
        """Queue the removal of a job's entry (its record is taken back)."""
        pipe.zrem(keys.deadline_jobs(keys.shard_of(job_id)), job_id)

    def expire_due(self, now: float) -> list[str]:
        """End every queued, unstarted job whose deadline is at or before ``now``; returns their
        ids. One pipelined read over the shards, then one script call per due entry."""
        due = self._runner.per_shard("zrangebyscore", keys.deadline_jobs, "-inf", repr(now))
        job_ids = [str(job_id) for shard in due for job_id in shard]
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
