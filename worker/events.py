"""Token events: what a worker publishes per decoding step and what the replay log stores.

A step message on ``keys.EVENTS_CHANNEL`` carries the token events of every job that advanced in
that step plus the ids of jobs that finished, so one PUBLISH serves the whole batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokenEvent:
    """Token ``index`` (0-based) of a job and the text it released (may be empty while held)."""

    job_id: str
    index: int
    text: str

    def to_log_entry(self) -> str:
        """The replay-log form; the job id is implied by the list's key."""
        return json.dumps({"index": self.index, "text": self.text}, ensure_ascii=False)

    @classmethod
    def from_log_entry(cls, job_id: str, raw: str | bytes) -> TokenEvent:
        data = json.loads(raw)
        return cls(job_id=job_id, index=int(data["index"]), text=str(data["text"]))

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "text": self.text}


@dataclass
class StepMessage:
    """Everything one publisher flush announces: new tokens and finished jobs."""

    tokens: list[TokenEvent] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)

    def encode(self) -> str:
        return json.dumps(
            {"t": [[e.job_id, e.index, e.text] for e in self.tokens], "d": self.finished},
            ensure_ascii=False,
        )

    @classmethod
    def decode(cls, raw: str | bytes) -> StepMessage:
        data = json.loads(raw)
        return cls(
            tokens=[TokenEvent(str(j), int(i), str(t)) for j, i, t in data.get("t", [])],
            finished=[str(job_id) for job_id in data.get("d", [])],
        )
