"""The engine's capacity, one definition for every load benchmark.

``bench.outside`` and ``bench.admission`` once took different capacities as their 1.0x:
the outside method the best of CTranslate2's compute types and 1-2 intra threads, the inside
one ``generate_batch(32)`` on the worker's own replica (int8, one intra thread, sampled). On
the 46M model that is 438 against about 250 tokens/s here, so the inside "0.5x" was the
outside's 0.3x and the two tails could not agree. Both now take this one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import ctranslate2

from worker.engine.model_hints import resolve_compute_type


@dataclass(frozen=True)
class Capacity:
    tokens_per_s: float
    compute_type: str
    intra_threads: int
    # CPU seconds of this process (all its threads) per token, in µs, in the timed call: what
    # a serving path's own CPU per token is held against (issue 53, item 3).
    cpu_us_per_token: float = 0.0

    def describe(self) -> str:
        return f"{self.compute_type}, intra_threads {self.intra_threads}"


def batch_capacity(path: Path, pieces: list[str], max_tokens: int, size: int = 32) -> Capacity:
    """CTranslate2 alone, greedy, ``generate_batch(size)`` of ``pieces`` for ``max_tokens``:
    the best tokens/s over the model's compute types (its hint, else int8 and float32) and 1-2
    intra threads, each warmed once and timed twice."""
    hinted = resolve_compute_type(path, "auto")
    compute_types = [hinted] if hinted != "auto" else ["int8", "float32"]
    best = Capacity(0.0, "", 0)
    options = {"max_length": max_tokens, "end_token": [], "sampling_topk": 1}
    for compute_type in compute_types:
        for intra in (1, 2):
            generator = ctranslate2.Generator(
                str(path), device="cpu", compute_type=compute_type, intra_threads=intra
            )
            generator.generate_batch([pieces] * size, **options)  # warm
            for _ in range(2):
                began, cpu_began = time.perf_counter(), time.process_time()
                results = generator.generate_batch([pieces] * size, **options)
                tokens = sum(len(r.sequences_ids[0]) for r in results)
                rate = tokens / (time.perf_counter() - began)
                cpu_us = 1e6 * (time.process_time() - cpu_began) / max(tokens, 1)
                if rate > best.tokens_per_s:
                    best = Capacity(rate, compute_type, intra, cpu_us)
            del generator
    return best
