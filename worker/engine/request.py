"""What a caller asks the engine for and gets back, without the engine itself.

The scheduler, its policies and the batch bookkeeping deal in these; only ``worker.engine.engine``
starts processes and loads CTranslate2's side of the pipes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trickle.events import Alternatives
from trickle.params import GenerationParams


@dataclass(frozen=True, slots=True)
class Scored:
    """What the engine process sends instead of a bare log-probability for such a job."""

    logprob: float
    top: Alternatives


# What the engine reports with each token: its log-probability, with alternatives when asked.
Logprob = float | Scored | None


class EngineError(RuntimeError):
    """A batch failed inside CTranslate2, or the engine process died under it."""


@dataclass(frozen=True)
class SamplingKey:
    """Decoding options CTranslate2 takes per call: requests sharing one batch must agree."""

    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    ignore_eos: bool
    # CTranslate2's min_length is per call too; a resumed job owes only what it has not generated.
    min_tokens: int = 0

    @classmethod
    def from_params(cls, params: GenerationParams, generated: int = 0) -> SamplingKey:
        min_tokens = 0 if params.ignore_eos else max(0, params.min_tokens - generated)
        if params.is_greedy:
            # Greedy: CTranslate2 spells it top_k=1; temperature and top_p no longer matter.
            return cls(1.0, 1, 1.0, params.repetition_penalty, params.ignore_eos, min_tokens)
        return cls(
            params.temperature,
            params.top_k,
            params.top_p,
            params.repetition_penalty,
            params.ignore_eos,
            min_tokens,
        )


@dataclass(frozen=True)
class EngineRequest:
    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingKey
    # A seeded job runs alone, on a Generator seeded for it (worker.engine.seeded).
    seed: int | None = None
    # The leading ids of prompt_ids that are a shared prefix (worker.engine.prefix): the engine
    # runs them as CTranslate2's cached static prompt. Every request of a batch has the same.
    prefix: tuple[int, ...] = ()
    # Whose cached prefixes it may use (worker.engine.prefix.cache_partition: its API key's or
    # its cache_salt's); once it has a prefix, that prefix's partition (``SHARED`` for a
    # configured one). Every request of a batch with a prefix has the same.
    cache_partition: str = ""
    # A grammar the output must match (worker/engine/constrained.py): such a request shares
    # batches only with others that read their logits (worker/engine/shared_rows.py).
    grammar: str | None = None
    grammar_replay: str = ""  # what it streamed before a resume, replayed into its matcher
    # Alternatives to report per token (worker/engine/alternatives.py): the same.
    top_logprobs: int = 0
    # Whether a constrained request may share its batch: the scheduler's sharing gate decides
    # when it takes the job in (worker/engine/sharing_gate.py); False runs it alone.
    shares_calls: bool = True


def reads_logits(request: EngineRequest) -> bool:
    """Whether a request needs its own row's logits each step (a grammar's refused tokens,
    reported alternatives): its batch copies the vocabulary's logits every step."""
    return request.grammar is not None or request.top_logprobs > 0


# (position in batch, decoding step, token id, log-probability, is_last) -> True to stop it.
# The step counts decoding-loop iterations of the batch: a sequence whose prompt is longer than
# the batch's shortest reports its first token at a later step (CTranslate2 feeds the extra
# prompt tokens through the loop).
StepCallback = Callable[[int, int, int, Logprob, bool], bool]


@dataclass
class StepClock:
    """When the decoding step being delivered began (``time.monotonic``, the engine process's
    reading): steps can arrive together (``engine_step_coalesce_ms``), so their arrival times
    do not say how long each took."""

    started_at: float = 0.0
