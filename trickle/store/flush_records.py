"""A worker's flush as the store sends it, and what Redis answers: fenced token appends and a
final state, each of which may find the replay log shorter than the tokens the worker sent
(Redis lost its newest writes: ``worker.kept_tokens`` restores them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trickle.events import TokenEvent


@dataclass(frozen=True)
class StepAppend:
    """One job's share of a publisher flush."""

    job_id: str
    fence: str
    events: Sequence[TokenEvent]
    first_token_at: float | None = None


@dataclass(frozen=True)
class StepOutcome:
    fenced_out: list[str]  # jobs whose lease this worker no longer holds
    cancel_requested: list[str]
    # Jobs whose replay log is shorter than their appends' first index, with its length: Redis
    # lost its newest entries (a restart without its last writes), nothing was appended.
    short_logs: dict[str, int] = field(default_factory=dict)


def finish_outcome(reply: Any) -> bool | int:
    """A ``queue_finish`` reply: True stored, False not this worker's lease, or the replay
    log's length when it is shorter than the tokens the worker sent (nothing stored)."""
    if isinstance(reply, list):
        return int(reply[0])
    return bool(reply)
