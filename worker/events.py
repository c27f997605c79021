"""Token events: what a worker publishes per decoding step and what the replay log stores.

A step message on ``keys.EVENTS_CHANNEL`` carries the token events of every job that advanced in
that step plus the ids of jobs that finished, so one PUBLISH serves the whole batch. A job that
changes status without a token (claimed, requeued) is announced in ``changed``: readers then
re-read its state and tell their clients (``status`` events).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokenEvent:
    """Token ``index`` (0-based) of a job and the text it released (may be empty while held).

    ``logprob`` is the sampled token's log-probability under the model (None if unknown).
    """

    job_id: str
    index: int
    text: str
    logprob: float | None = None

    def to_log_entry(self) -> str:
        """The replay-log form; the job id is implied by the list's key."""
        return json.dumps(
            {"index": self.index, "text": self.text, "logprob": self.logprob}, ensure_ascii=False
        )

    @classmethod
    def from_log_entry(cls, job_id: str, raw: str | bytes) -> TokenEvent:
        data = json.loads(raw)
        return cls(job_id, int(data["index"]), str(data["text"]), _logprob(data.get("logprob")))

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "text": self.text}


@dataclass
class StepMessage:
    """Everything one publisher flush announces: new tokens and finished jobs."""

    tokens: list[TokenEvent] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # jobs now queued or running

    def encode(self) -> str:
        message: dict[str, Any] = {
            "t": [[e.job_id, e.index, e.text, e.logprob] for e in self.tokens],
            "d": self.finished,
        }
        if self.changed:
            message["s"] = self.changed
        return json.dumps(message, ensure_ascii=False)

    @classmethod
    def decode(cls, raw: str | bytes) -> StepMessage:
        data = json.loads(raw)
        return cls(
            tokens=[
                TokenEvent(str(job), int(index), str(text), _logprob(logprob))
                for job, index, text, logprob in data.get("t", [])
            ],
            finished=[str(job_id) for job_id in data.get("d", [])],
            changed=[str(job_id) for job_id in data.get("s", [])],
        )


def _logprob(value: Any) -> float | None:
    return None if value is None else float(value)
