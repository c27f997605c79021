"""What travels from the engine thread to the publisher's queue: tokens, ends and notices.

Their own module so that the publisher, what it keeps (``kept_tokens``) and the engine's step
buffer (``engine.batch``) share them without importing each other.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import NamedTuple

from trickle.events import TokenEvent
from trickle.job_result import JobResult


class TokenItem(NamedTuple):
    """One token on its way out (a named tuple: one is built per token on the engine thread)."""

    event: TokenEvent
    fence: str  # the lease this worker holds on the job: writes without it are refused
    first_token_at: float | None = None


class StepItem(NamedTuple):
    """Every token one decoding step produced across a batch: published together."""

    tokens: tuple[TokenItem, ...]
    urgent: bool  # a job's first tokens among them: the flush goes at once


class Forget(NamedTuple):
    """A job that ended without a final state from this worker (its lease lost, handed back):
    the tokens kept for it go."""

    job_id: str


@dataclass(frozen=True)
class FinishItem:
    job_id: str
    fence: str
    result: JobResult
    persisted: threading.Event = field(default_factory=threading.Event)


class Recheck(NamedTuple):
    """Redis restarted: send the final states stored lately again."""


Item = StepItem | FinishItem | Forget | Recheck
