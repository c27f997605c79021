"""Building a job for the scheduler: its engine request and its sequence state, from a claimed
job's prompt ids and parameters (and what it streamed before, when it resumes).

Apart from ``worker.engine.scheduled`` so the modules that only read a job's shape (batches,
policy, fair shares) do not import the sequence state's detokenizer and stop matcher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trickle.params import GenerationParams
from trickle.tokenization import Tokenizer
from worker.engine.request import EngineRequest, SamplingKey
from worker.engine.scheduled import ScheduledJob
from worker.engine.sequence import SequenceState


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
