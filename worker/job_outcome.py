"""The final state a job stores once its generation ended on this worker.

Apart from ``worker.runtime``, which stores it, accounts for it and traces it: deciding what
the job's end was (failed, expired before its first token, canceled or done) reads only the
job and its scheduled copy, so it stands without Redis, the publisher or the engines.
"""

from __future__ import annotations

import time
from dataclasses import replace

from trickle.job_result import JobResult
from trickle.jobs import FinishReason, Job, JobError, JobStatus
from worker.engine.scheduled import ScheduledJob


def ended_result(job: Job, scheduled: ScheduledJob, claimed_at: float) -> JobResult:
    """What ``job`` stores when ``scheduled`` (its copy here, not handed back and its lease
    kept) ended; ``claimed_at``: when this worker claimed it (0: unknown)."""
    state = scheduled.state
    if scheduled.error is not None or state.error is not None:
        error = state.error or JobError("engine_error", str(scheduled.error))
        result = JobResult.failed(error, state.output, state.count)
    elif state.finish_reason is FinishReason.DEADLINE and state.count == 0 and job.deadline:
        # Its deadline came before its first token (it waited for a lane): never started.
        result = JobResult.expired(claimed_at)
    else:
        reason = state.finish_reason or FinishReason.LENGTH
        status = JobStatus.CANCELED if reason is FinishReason.CANCELED else JobStatus.SUCCEEDED
        result = JobResult(
            status,
            state.output,
            reason,
            state.count,
            time.time(),
            stop_sequence=state.stop_sequence,
        )
    return replace(result, claimed_at=claimed_at or None)
