"""How a job ended, as its worker reports it: the final state the FINISH script stores."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from trickle.jobs import FinishReason, JobError, JobStatus

NOT_STARTED_BY_DEADLINE = JobError(
    "deadline_exceeded",
    "not started before its deadline (Cancel-After or deadline), so it was not run",
)


@dataclass(frozen=True)
class JobResult:
    """How a job ended, as the worker reports it (FINISH stores it)."""

    status: JobStatus
    output: str
    finish_reason: FinishReason
    completion_tokens: int
    completed_at: float
    error: JobError | None = None
    # The stop string that ended the job ("" for an end token, a length or no stop at all).
    stop_sequence: str = ""
    # When this attempt's claim returned (the end of the job's ``claim`` hop), if known.
    claimed_at: float | None = None

    @classmethod
    def failed(cls, error: JobError, output: str, completion_tokens: int) -> JobResult:
        """A failure keeps what was already streamed, so output and stream still agree."""
        return cls(
            JobStatus.FAILED, output, FinishReason.ERROR, completion_tokens, time.time(), error
        )

    @classmethod
    def expired(cls, claimed_at: float) -> JobResult:
        """A job not started before its client's deadline: not run, its readers told why."""
        return cls(
            JobStatus.EXPIRED,
            "",
            FinishReason.DEADLINE,
            0,
            time.time(),
            NOT_STARTED_BY_DEADLINE,
            "",
            claimed_at,
        )

    def to_hash(self) -> dict[str, str]:
        """The job hash's fields this final state sets."""
        values = {
            "status": self.status.value,
            "output": self.output,
            "finish_reason": self.finish_reason.value,
            "completion_tokens": str(self.completion_tokens),
            "completed_at": repr(self.completed_at),
        }
        if self.error is not None:
            values["error"] = json.dumps(self.error.to_dict())
        if self.stop_sequence:
            values["stop_sequence"] = self.stop_sequence
        if self.claimed_at is not None:
            values["claimed_at"] = repr(self.claimed_at)
        return values
