"""A model's own sampling defaults: what a request that leaves a sampling field out gets.

The APIs' defaults (temperature 1, no top_p or top_k, no repetition penalty, a short
``max_tokens``) suit a large model; a small one sampled so babbles, and greedy it repeats
itself until its answer is cut, which the Agents SDK refuses. Models ship the settings they
were tuned for in ``generation_config.json`` (Llama 3: temperature 0.6, top_p 0.9; Qwen 2.5:
0.7, 0.8, top_k 20, repetition_penalty 1.05), and vLLM applies them to requests that leave
the field out; so does Trickle, the configuration's ``[models.<name>.sampling]`` first. A
field the request sends always wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from trickle.config.base import Section
from trickle.params import (
    MAX_REPETITION_PENALTY,
    MAX_TEMPERATURE,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    MIN_TOP_P,
)

# The API's own bounds: a default the API would refuse from a client would fail every job.
Temperature = Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE)]
TopP = Annotated[float, Field(ge=MIN_TOP_P, le=1.0)]
TopK = Annotated[int, Field(ge=0, le=MAX_TOP_K)]
Penalty = Annotated[float, Field(ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY)]
MaxTokens = Annotated[int, Field(ge=1)]

# generation_config.json's keys, as vLLM reads them, and the field each sets.
GENERATION_CONFIG_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


@dataclass(frozen=True)
class ModelSampling(Section):
    """``[models.<name>.sampling]``: this model's defaults for requests that leave a field out.
    Unset: the model directory's ``generation_config.json``, else the APIs' own default."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    repetition_penalty: Penalty | None = None
    # Unset: ``limits.default_max_tokens``. Held to ``limits.max_tokens_ceiling`` (a stack
    # with a lower ceiling serves the model's table unchanged).
    max_tokens: MaxTokens | None = None


@dataclass(frozen=True)
class SamplingDefaults:
    """The defaults a model's requests get, resolved; ``max_tokens`` None: the limits' own."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int | None = None

    def under(
        self,
        temperature: float | None,
        top_p: float | None,
        top_k: int | None,
        repetition_penalty: float | None,
    ) -> dict[str, Any]:
        """The sampling ``GenerationParams`` takes: each value a request sent (None: not sent),
        else this default; one rule for every route."""
        return {
            "temperature": self.temperature if temperature is None else float(temperature),
            "top_p": self.top_p if top_p is None else float(top_p),
            "top_k": self.top_k if top_k is None else top_k,
            "repetition_penalty": (
                self.repetition_penalty if repetition_penalty is None else float(repetition_penalty)
            ),
        }


_FIELDS = TypeAdapter(ModelSampling)


def resolve_sampling(table: ModelSampling, generation_config: dict[str, Any]) -> SamplingDefaults:
    """The configuration's values, else ``generation_config.json``'s (a value outside the
    field's range there is skipped, as an unset one: the file is the model's, not the
    operator's), else the APIs' defaults. The web tier holds ``max_tokens`` to
    ``limits.max_tokens_ceiling``."""
    from_file = _valid_file_values(generation_config)
    chosen = {
        name: getattr(table, name) if getattr(table, name) is not None else from_file.get(name)
        for name in GENERATION_CONFIG_KEYS.values()
    }
    return SamplingDefaults(**{name: value for name, value in chosen.items() if value is not None})


def _valid_file_values(generation_config: dict[str, Any]) -> dict[str, Any]:
    """The file's values the configuration's table would take, typed as it types them."""
    values: dict[str, Any] = {}
    for key, name in GENERATION_CONFIG_KEYS.items():
        value = generation_config.get(key)
        if value is None or isinstance(value, bool):
            continue
        try:
            values[name] = getattr(_FIELDS.validate_python({name: value}), name)  # as typed
        except ValidationError:
            continue
    return values
