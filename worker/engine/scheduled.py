"""A job as the scheduler holds it: its engine request, its sequence state, and its timings.

Kept apart from the scheduler's threads so the batch and policy modules (and the worker's
in-flight table and accounting) can use the job's shape without the lanes that run it. The
sequence state is seen through ``SequenceView``, the members the worker uses, so the modules
that decide about batches do not depend on how text is detokenized and stop strings matched
(``worker.engine.sequence`` implements it; ``worker.engine.new_job`` builds a job with it).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Protocol

from trickle.events import Alternatives, TokenEvent
from trickle.jobs import FinishReason, JobError
from worker.engine.request import EngineRequest

DEADLINE_ERROR = JobError("deadline_exceeded", "the job ran past limits.max_job_seconds")


@dataclass(frozen=True)
class TokenOutcome:
    """What one generated token produced: the event to publish (if any) and whether it ended."""

    index: int | None
    text: str
    finish_reason: FinishReason | None


class SequenceView(Protocol):
    """A job's generation state as the worker uses it: the engine callback feeds it tokens,
    other threads ask it to stop, and the job's result reads what it produced."""

    count: int  # tokens accounted for, resumed ones included
    error: JobError | None
    finish_reason: FinishReason | None
    stop_sequence: str

    @property
    def output(self) -> str: ...

    @property
    def finished(self) -> bool: ...

    @property
    def stop_requested(self) -> FinishReason | None: ...

    def on_token(self, token_id: int, is_last: bool) -> TokenOutcome: ...

    def request_stop(self, reason: FinishReason, error: JobError | None = None) -> None: ...

    def finish_without_token(self, reason: FinishReason) -> None: ...


@dataclass
class ScheduledJob:
    job_id: str
    fence: str  # this worker's lease on the job: every write carries it
    request: EngineRequest
    state: SequenceView
    deadline: float | None = None  # wall-clock time past which the job is stopped and failed
    # How it is stopped then: failed past limits.max_job_seconds; at its client's own deadline
    # (earlier), ended with what it made (``finish_reason: deadline``).
    deadline_stop: tuple[FinishReason, JobError | None] = (FinishReason.ERROR, DEADLINE_ERROR)
    ended: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    handed_back: bool = False  # returned to the queue unstarted (graceful shutdown)
    priority: int = 0  # lower runs first (interactive before batch)
    tenant: str = ""  # its key's name (trickle/tenants.py): the engine's fair share is by key
    # When this attempt entered a batch, and its token arrival times (metrics and traces).
    batch_started_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    first_published_at: float | None = None  # set by the publisher's confirmation
    # Tokens the engine produced after the worker had ended the sequence (a stop string, a
    # cancel, a deadline): dropped unseen; how many shows how fast the engine's flag is read.
    tokens_after_end: int = 0
    # Token ids generated in this attempt: a restarted batch continues from prompt + these.
    generated_ids: list[int] = field(default_factory=list)
    restarts: int = 0
    long_pauses: int = 0  # restarts past rebatch_max_stall_ms: at most one per job
    # Whether its first batch found its shared prefix already cached (None: it has none).
    prefix_hit: bool | None = None
    # What the lanes were doing when it arrived, and the batch it started in (the job log's
    # ``lanes_at_arrival`` and ``started_in``): where a slow first token waited, by name.
    lanes_at_arrival: str = ""
    started_in: str = ""

    def current_request(self) -> EngineRequest:
        """The engine request that continues this job from where it is now."""
        if not self.generated_ids:
            return self.request
        return dataclasses.replace(
            self.request,
            prompt_ids=[*self.request.prompt_ids, *self.generated_ids],
            max_new_tokens=self.request.max_new_tokens - len(self.generated_ids),
        )

    def total_length(self) -> int:
        """Prompt plus what this attempt generated: what a restart feeds the engine again."""
        return len(self.request.prompt_ids) + len(self.generated_ids)

    def remaining_tokens(self) -> int:
        return self.request.max_new_tokens - len(self.generated_ids)

    def token_event(
        self,
        outcome: TokenOutcome,
        logprob: float | None = None,
        top: Alternatives | None = None,
    ) -> TokenEvent:
        """The event of a token that produced ``outcome`` (its index set); the one that ended
        the job carries its end, so the replay log says the job is complete."""
        assert outcome.index is not None
        end = outcome.finish_reason
        stop = self.state.stop_sequence if end is not None else ""
        return TokenEvent(self.job_id, outcome.index, outcome.text, logprob, top, end, stop)
