"""A job as the scheduler holds it: its engine request, its sequence state, and its timings.

Kept apart from the scheduler's threads so the batch and policy modules (and the worker's
in-flight table and accounting) can use the job's shape without the lanes that run it.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Protocol

from trickle.jobs import JobError
from trickle.params import GenerationParams
from trickle.tokenizer import Tokenizer
from worker.engine.request import EngineRequest, SamplingKey
from worker.engine.sequence import SequenceState

DEADLINE_ERROR = JobError("deadline_exceeded", "the job ran past limits.max_job_seconds")


@dataclass
class ScheduledJob:
    job_id: str
    fence: str  # this worker's lease on the job: every write carries it
    request: EngineRequest
    state: SequenceState
    deadline: float | None = None  # wall-clock time past which the job is stopped and failed
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


class JobVocabulary(Protocol):
    """What a job's state needs of its engine (``Engine`` is one): its tokenizer, and the ids
    that end a job."""

    tokenizer: Tokenizer

    def stop_ids(self, params: GenerationParams) -> frozenset[int]: ...


@dataclass(frozen=True)
class Resume:
    """What a job had already streamed before its previous worker died."""

    text: str = ""
    count: int = 0


def make_scheduled_job(
    engine: JobVocabulary,
    job_id: str,
    prompt_ids: list[int],
    params: GenerationParams,
    fence: str,
    resume: Resume = Resume(),
    deadline: float | None = None,
    priority: int = 0,
    tenant: str = "",
    cache_partition: str = "",
) -> ScheduledJob:
    """Engine request plus per-job state; ``prompt_ids`` include any resumed text;
    ``cache_partition``: whose cached prefixes it may use (worker.engine.prefix)."""
    state = SequenceState(
        engine.tokenizer,
        prompt_ids,
        params.max_tokens,
        params.stop,
        engine.stop_ids(params),
        resumed_text=resume.text,
        resumed_count=resume.count,
    )
    # A seed matters only when sampling; greedy jobs batch with everyone.
    seed = None if params.is_greedy else params.seed
    remaining = params.max_tokens - resume.count
    sampling = SamplingKey.from_params(params, generated=resume.count)
    request = EngineRequest(
        prompt_ids,
        remaining,
        sampling,
        seed,
        cache_partition=cache_partition,
        grammar=params.grammar,
        grammar_replay=resume.text if params.grammar is not None else "",
        top_logprobs=params.top_logprobs,
    )
    return ScheduledJob(job_id, fence, request, state, deadline, priority=priority, tenant=tenant)
