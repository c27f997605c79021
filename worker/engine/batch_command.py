"""One ``generate_batch`` as the worker asks the engine process for it (pickled as a dict)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BatchCommand:
    """One ``generate_batch`` to run: prompts as pieces, a stop-flag slot per sequence."""

    batch_id: int
    prompts: list[list[str]]
    max_new_tokens: list[int]
    slots: list[int]
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    ignore_eos: bool
    min_tokens: int = 0
    seed: int | None = None
    # Pieces every prompt of the batch starts with (``prompts`` hold the rest): CTranslate2
    # prefills them once and caches the state for the next batch with the same ones.
    static_prompt: list[str] | None = None
    # Whether CTranslate2 may start from its cached state of ``static_prompt`` (and save it):
    # False computes it for this batch alone (another partition's state, or past the budget).
    cache_static_prompt: bool = True
    # Per row: a grammar it must match (worker/engine/constrained.py), and the text it had
    # streamed before a resume, which its matcher replays first (empty: no grammar).
    grammars: list[str | None] = field(default_factory=list)
    grammar_replays: list[str] = field(default_factory=list)
    # Per row: alternatives to report per token (worker/engine/alternatives.py; empty: none).
    top_logprobs: list[int] = field(default_factory=list)

    def reads_logits(self) -> bool:
        """Whether a row needs its own logits (worker/engine/shared_rows.py)."""
        return any(g is not None for g in self.grammars) or any(self.top_logprobs)

    def grammar(self, row: int) -> str | None:
        return self.grammars[row] if self.grammars else None

    def alternatives(self, row: int) -> int:
        return self.top_logprobs[row] if self.top_logprobs else 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchCommand:
        return cls(**data)
