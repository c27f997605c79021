"""The engine's own limit: CTranslate2 called directly, in this process, no Trickle at all.

Sampling exactly as Trickle's worker asks for it (temperature, top_k, top_p, repetition penalty 1,
``return_scores``, prompt excluded from the result) and a fixed output length (``end_token=[]``,
Trickle's ``ignore_eos``).
"""

from __future__ import annotations

import time
from typing import Any

import ctranslate2

from bench.harness.log import progress
from bench.harness.models import PreparedModel
from bench.harness.params import RunParams
from bench.harness.stats import median, summary
from worker.engine.model_hints import resolve_compute_type


def load_generator(model: PreparedModel, params: RunParams) -> ctranslate2.Generator:
    """The Generator exactly as Trickle's worker builds it (same device and thread knobs)."""
    return ctranslate2.Generator(
        str(model.path),
        device=params.resolved_device(),
        device_index=[0],
        compute_type=resolve_compute_type(model.path, params.compute_type),
        inter_threads=params.inter_threads,
        intra_threads=params.intra_threads,
    )


def _batch_kwargs(params: RunParams) -> dict[str, Any]:
    return {
        "max_length": params.max_tokens,
        "sampling_temperature": params.temperature,
        "sampling_topk": params.top_k,
        "sampling_topp": params.top_p,
        "repetition_penalty": 1.0,
        "beam_size": 1,
        "return_scores": True,
        "include_prompt_in_result": False,
        "end_token": [],
    }


def stream_once(
    generator: ctranslate2.Generator, pieces: list[str], params: RunParams
) -> tuple[float, float, int]:
    """One ``generate_tokens`` stream: (TTFT s, first->last token s, tokens)."""
    start = time.perf_counter()
    first = last = start
    count = 0
    for _step in generator.generate_tokens(
        pieces,
        max_length=params.max_tokens,
        sampling_temperature=params.temperature,
        sampling_topk=params.top_k,
        sampling_topp=params.top_p,
        repetition_penalty=1.0,
        return_log_prob=True,
        end_token=[],
    ):
        last = time.perf_counter()
        if count == 0:
            first = last
        count += 1
    return first - start, last - first, count


def batch_once(
    generator: ctranslate2.Generator,
    pieces: list[str],
    params: RunParams,
    size: int,
    with_callback: bool,
) -> tuple[float, int]:
    """One ``generate_batch`` of ``size`` copies of the prompt: (wall s, tokens generated)."""

    def noop(_step: ctranslate2.GenerationStepResult) -> bool:
        return False

    kwargs = _batch_kwargs(params)
    if with_callback:
        kwargs["callback"] = noop
    start = time.perf_counter()
    results = generator.generate_batch([pieces] * size, **kwargs)
    wall = time.perf_counter() - start
    return wall, sum(len(result.sequences_ids[0]) for result in results)


def measure(
    model: PreparedModel,
    pieces: list[str],
    params: RunParams,
    stream_runs: int,
    batch_sizes: list[int],
    batch_reps: int,
) -> dict[str, Any]:
    generator = load_generator(model, params)
    try:
        stream_once(generator, pieces, params)  # warm-up: first call allocates
        ttfts: list[float] = []
        rates: list[float] = []
        token_counts: list[int] = []
        for _ in range(stream_runs):
            ttft, span, count = stream_once(generator, pieces, params)
            ttfts.append(ttft * 1000)
            token_counts.append(count)
            if count > 1 and span > 0:
                rates.append((count - 1) / span)
        progress(
            f"engine generate_tokens: TTFT p50 {median(ttfts) or 0:.2f} ms, "
            f"{median(rates) or 0:.0f} tok/s over {stream_runs} runs"
        )
        batches = [_measure_batch(generator, pieces, params, n, batch_reps) for n in batch_sizes]
    finally:
        generator.unload_model()
        del generator
    return {
        "generate_tokens": {
            "runs": stream_runs,
            "tokens_per_run": sorted(set(token_counts)),
            "ttft_ms": summary(ttfts),
            "tokens_per_s": summary(rates),
        },
        "generate_batch": batches,
    }


def _measure_batch(
    generator: ctranslate2.Generator, pieces: list[str], params: RunParams, size: int, reps: int
) -> dict[str, Any]:
    batch_once(generator, pieces, params, size, with_callback=False)  # warm-up at this size
    plain: list[float] = []
    callback: list[float] = []
    tokens = 0
    for _ in range(reps):
        wall, tokens = batch_once(generator, pieces, params, size, with_callback=False)
        plain.append(tokens / wall)
        wall, _ = batch_once(generator, pieces, params, size, with_callback=True)
        callback.append(tokens / wall)
    result = {
        "n": size,
        "tokens": tokens,
        "tokens_per_s": median(plain),
        "tokens_per_s_runs": plain,
        "with_callback_tokens_per_s": median(callback),
        "with_callback_runs": callback,
    }
    progress(
        f"engine generate_batch N={size}: {result['tokens_per_s'] or 0:.0f} tok/s "
        f"({result['with_callback_tokens_per_s'] or 0:.0f} with a no-op callback)"
    )
    return result
