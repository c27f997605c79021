"""One ``generate_batch`` as the worker asks the engine process for it (pickled as a dict)."""

from __future__ import annotations

from dataclasses import dataclass
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
    # A grammar the one sequence must match (worker/engine/constrained.py), and the text it
    # had streamed before a resume, which its matcher replays first.
    grammar: str | None = None
    grammar_replay: str = ""
    # Alternatives to report per token (worker/engine/alternatives.py); the batch is of one.
    top_logprobs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchCommand:
        return cls(**data)
