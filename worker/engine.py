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
import numpy as np

from worker.config import ModelSettings
from worker.jobs import GenerationParams
from worker.sampling import apply_repetition_penalty, log_softmax, sample_token
from worker.tokenizer import Tokenizer


@dataclass(frozen=True)
class SamplingKey:
    """Decoding options CTranslate2 takes per call: requests sharing one batch must agree."""

    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    ignore_eos: bool

    @classmethod
    def from_params(cls, params: GenerationParams) -> SamplingKey:
        if params.is_greedy:
            # Greedy: CTranslate2 spells it top_k=1; temperature and top_p no longer matter.
            return cls(1.0, 1, 1.0, params.repetition_penalty, params.ignore_eos)
        return cls(
            params.temperature,
            params.top_k,
            params.top_p,
            params.repetition_penalty,
            params.ignore_eos,
        )


@dataclass(frozen=True)
class EngineRequest:
    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingKey
    # Seeded sampling runs alone, sampled by Trickle (see worker.sampling); None: CTranslate2's.
    seed: int | None = None


# (position in batch, decoding step, token id, log-probability, is_last) -> True to stop it.
# The step counts decoding-loop iterations of the batch: a sequence whose prompt is longer than
# the batch's shortest reports its first token at a later step (CTranslate2 feeds the extra
# prompt tokens through the loop).
StepCallback = Callable[[int, int, int, float | None, bool], bool]


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
        self._warm_up()

    def _warm_up(self) -> None:
        """One small batch per engine thread before the first job: CTranslate2's first calls
        run about twice as slow (allocations), which users would otherwise pay as TTFT."""
        start = self.tokenizer.to_pieces(self.tokenizer.encode("The"))
        for _ in range(max(self.settings.inter_threads, 1)):
            self.generator.generate_batch([start] * 4, max_length=8, include_prompt_in_result=False)

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
        if requests[0].seed is not None:
            if len(requests) != 1:
                raise ValueError("seeded requests run one at a time")
            self._generate_seeded(requests[0], on_step)
            return
        if any(not request.prompt_ids for request in requests):
            raise ValueError("the prompt is empty and the model adds no start token")
        prompts = [self.tokenizer.to_pieces(list(r.prompt_ids)) for r in requests]

        def callback(step: ctranslate2.GenerationStepResult) -> bool:
            return on_step(step.batch_id, step.step, step.token_id, step.log_prob, step.is_last)

        self.generator.generate_batch(
            prompts,
            max_length=max(r.max_new_tokens for r in requests),
            sampling_temperature=sampling.temperature,
            sampling_topk=sampling.top_k,
            sampling_topp=sampling.top_p,
            repetition_penalty=sampling.repetition_penalty,
            beam_size=1,
            return_scores=True,  # the sampled token's log-probability reaches the callback
            include_prompt_in_result=False,
            end_token=[] if sampling.ignore_eos else None,
            callback=callback,
        )

    def _generate_seeded(self, request: EngineRequest, on_step: StepCallback) -> None:
        """One token per CTranslate2 call, sampled here from the returned logits.

        Every step re-runs the prefix (CTranslate2 keeps no cache across calls), so this costs
        O(n^2) in the output length: the price of a repeatable seed, paid only by seeded jobs.
        """
        sampling = request.sampling
        rng = np.random.default_rng(request.seed)
        ids = list(request.prompt_ids)
        pieces = self.tokenizer.to_pieces(ids)
        for step in range(request.max_new_tokens):
            result = self.generator.generate_batch(
                [pieces],
                max_length=1,
                sampling_topk=1,
                include_prompt_in_result=False,
                return_logits_vocab=True,
                end_token=[],
            )
            logits = np.asarray(result[0].logits[0], dtype=np.float64).reshape(-1)
            logits = apply_repetition_penalty(logits, ids, sampling.repetition_penalty)
            token_id = sample_token(
                logits, sampling.temperature, sampling.top_k, sampling.top_p, rng
            )
            logprob = float(log_softmax(logits)[token_id])
            at_end = token_id == self.eos_id and not sampling.ignore_eos
            is_last = at_end or step == request.max_new_tokens - 1
            if on_step(0, step, token_id, logprob, is_last) or is_last:
                return
            ids.append(token_id)
            pieces.append(self.tokenizer.to_pieces([token_id])[0])
