"""How a job is generated: the sampling and output options every API route fills in.

Shared by the web tier (which validates a request into them) and the worker (which runs them);
``to_dict`` is also the public ``params`` object of a job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from typing_extensions import TypedDict

MIN_SAMPLING_TEMPERATURE = 1e-5
# The sampling fields' bounds, for a request's fields and a model's defaults alike.
# CTranslate2 refuses a penalty that rounds to 0 in float32; below 0.01 is meaningless anyway.
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 10.0
# CTranslate2 needs 0 < top_p <= 1 in float32.
MIN_TOP_P = 1e-6
MAX_TOP_K = 1000
MAX_TEMPERATURE = 2.0


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 128
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    min_tokens: int = 0  # vLLM's: the end token cannot come before this many tokens
    stop_token_ids: tuple[int, ...] = ()  # vLLM's: these ids end the job too (never emitted)
    # vLLM's: jobs share cached prompt prefixes only with jobs of the same salt; "": only with
    # jobs of the same API key (worker/engine/prefix.py).
    cache_salt: str = ""
    # What the answer must match, as an llguidance grammar (trickle/grammar.py builds it from
    # response_format, text.format or a forced tool call); the engine enforces it token by token
    # (worker/engine/constrained.py). None: unconstrained.
    grammar: str | None = None
    # How many of each step's most likely tokens to report with it (0: the sampled one only).
    top_logprobs: int = 0
    # The client sent no max_tokens (the model's or the limits' default was taken): the web
    # tier shrinks it to the context the prompt leaves, as vLLM does, instead of refusing a
    # field nobody sent. Read only where the prompt is tokenized; never stored.
    max_tokens_defaulted: bool = field(default=False, compare=False)

    @property
    def is_greedy(self) -> bool:
        # A temperature that rounds to zero in float32 is greedy decoding, not a division by 0.
        return self.temperature < MIN_SAMPLING_TEMPERATURE or self.top_k == 1

    def to_dict(self) -> ParamsObject:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "stop": list(self.stop),
            "seed": self.seed,
            "ignore_eos": self.ignore_eos,
            "repetition_penalty": self.repetition_penalty,
            "min_tokens": self.min_tokens,
            "stop_token_ids": list(self.stop_token_ids),
            "cache_salt": self.cache_salt or None,
            "grammar": self.grammar,
            "top_logprobs": self.top_logprobs,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationParams:
        return cls(
            max_tokens=int(data["max_tokens"]),
            temperature=float(data["temperature"]),
            top_k=int(data["top_k"]),
            top_p=float(data["top_p"]),
            stop=tuple(data.get("stop") or ()),
            seed=None if data.get("seed") is None else int(data["seed"]),
            ignore_eos=bool(data.get("ignore_eos", False)),
            repetition_penalty=float(data.get("repetition_penalty", 1.0)),
            min_tokens=int(data.get("min_tokens", 0)),
            stop_token_ids=tuple(int(i) for i in data.get("stop_token_ids") or ()),
            cache_salt=str(data.get("cache_salt") or ""),
            grammar=None if data.get("grammar") is None else str(data["grammar"]),
            top_logprobs=int(data.get("top_logprobs") or 0),
        )


class ParamsObject(TypedDict):
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    stop: list[str]
    seed: int | None
    ignore_eos: bool
    repetition_penalty: float
    min_tokens: int
    stop_token_ids: list[int]
    cache_salt: str | None
    grammar: str | None
    top_logprobs: int
