"""The CTranslate2 generator and its tokenizer; knows nothing of Redis or Celery.

One ``Engine`` per served model per worker process: the model is loaded once and shared by every
batch. ``generate`` runs one ``generate_batch`` call and reports each new token through a callback
that runs on CTranslate2's own thread, so that callback must only hand tokens off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import ctranslate2

from worker.config import ModelSettings
from worker.tokenizer import Tokenizer


@dataclass(frozen=True)
class SamplingKey:
    """Decoding options CTranslate2 takes per call: requests sharing one batch must agree."""

    temperature: float
    top_k: int
    top_p: float
    ignore_eos: bool

    @classmethod
    def create(cls, temperature: float, top_k: int, top_p: float, ignore_eos: bool) -> SamplingKey:
        if temperature == 0.0 or top_k == 1:
            # Greedy: CTranslate2 spells it top_k=1; temperature and top_p no longer matter.
            return cls(temperature=1.0, top_k=1, top_p=1.0, ignore_eos=ignore_eos)
        return cls(temperature=temperature, top_k=top_k, top_p=top_p, ignore_eos=ignore_eos)


@dataclass(frozen=True)
class EngineRequest:
    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingKey


# (position in batch, token id, is_last) -> True to stop that sequence.
StepCallback = Callable[[int, int, bool], bool]


def resolve_device(device: str) -> str:
    """``auto`` picks CUDA when CTranslate2 sees a GPU, the CPU otherwise."""
    if device != "auto":
        return device
    return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"


class Engine:
    def __init__(self, model: ModelSettings):
        if not (Path(model.path) / "model.bin").is_file():
            raise ValueError(
                f"model {model.name!r}: no CTranslate2 model at {model.path} "
                "(run `trickle demo-model` or fix models.<name>.path)"
            )
        self.settings = model
        self.device = resolve_device(model.device)
        self.tokenizer = Tokenizer(model.tokenizer_path, add_bos=model.add_bos)
        self.generator = ctranslate2.Generator(
            model.path,
            device=self.device,
            device_index=list(model.device_index),
            compute_type=model.compute_type,
            inter_threads=model.inter_threads,
            intra_threads=model.intra_threads,
        )

    def close(self) -> None:
        """Free the model now: a Generator left to interpreter exit can abort the process."""
        self.generator.unload_model()
        del self.generator

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    def generate(self, requests: Sequence[EngineRequest], on_step: StepCallback) -> None:
        """Run one batch to completion; every request must share one ``SamplingKey``."""
        sampling = requests[0].sampling
        if any(request.sampling != sampling for request in requests):
            raise ValueError("a batch must share one sampling configuration")
        if any(not request.prompt_ids for request in requests):
            raise ValueError("the prompt is empty and the model adds no start token")
        prompts = [self.tokenizer.to_pieces(list(r.prompt_ids)) for r in requests]

        def callback(step: ctranslate2.GenerationStepResult) -> bool:
            return on_step(step.batch_id, step.token_id, step.is_last)

        self.generator.generate_batch(
            prompts,
            max_length=max(r.max_new_tokens for r in requests),
            sampling_temperature=sampling.temperature,
            sampling_topk=sampling.top_k,
            sampling_topp=sampling.top_p,
            beam_size=1,
            include_prompt_in_result=False,
            end_token=[] if sampling.ignore_eos else None,
            callback=callback,
        )
