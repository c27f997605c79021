"""Grammar-constrained decoding against the same model unconstrained, CTranslate2 in this
process (the engine process's code path without its pipes): what a schema costs per token.

For each model, one row alone, greedy, the prompt ``A person, as JSON:``:
- unconstrained: ``max_tokens`` tokens with the end token off (Trickle's ignore_eos);
- constrained: the person schema (bench/harness/json_model.py), up to ``max_tokens``;
  answers end when the grammar completes, or are closed at the budget.
Prints tokens/s of each, their ratio, the time for the constrained answer over the
unconstrained time for as many tokens, generate calls per 100 tokens (restarts after refused
tokens), and the matcher's CPU per accepted token (the answer replayed through a fresh
matcher, ``try_consume_tokens`` one token at a time).

    python -m bench.constrained [--models demo,json,bench,46m] [--max-tokens 100] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import ctranslate2
import llguidance
import numpy as np

from bench.harness.json_model import PERSON, build_json_model
from bench.harness.models import prepare
from bench.harness.stats import median
from trickle.closure import Closer
from trickle.grammar_matcher import MatcherCache
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer
from worker.engine.constrained import ConstrainedRun, Sampling, TokenSink
from worker.engine.model_hints import resolve_compute_type
from worker.engine.request import Logprob

PROMPT = "A person, as JSON: "
GRAMMAR = llguidance.LLMatcher.grammar_from_json_schema(
    PERSON, defaults={"whitespace_flexible": False}
)


def model_path(key: str) -> Path:
    if key == "json":
        return build_json_model()
    # The random models get the tokenizer's own vocabulary, so every id is a real piece.
    return prepare(key, vocab_size=2000 if key != "demo" else None).path


def collector(out: list[int]) -> TokenSink:
    """A sink that keeps the tokens (and stops at the last)."""

    def sink(token: int, logprob: Logprob, last: bool) -> bool:
        out.append(token)
        return last

    return sink


def measure(key: str, max_tokens: int, runs: int) -> dict[str, Any]:
    path = model_path(key)
    tokenizer = SentencePieceTokenizer(path / "tokenizer.model")
    generator = ctranslate2.Generator(
        str(path), device="cpu", compute_type=resolve_compute_type(path, "auto"), intra_threads=1
    )
    prompt = tokenizer.to_pieces(tokenizer.encode(PROMPT))
    matchers = MatcherCache(tokenizer)
    closer = Closer(tokenizer.token_bytes())
    ends = frozenset(tokenizer.end_ids)
    free_times: list[float] = []
    tight_times: list[float] = []
    calls: list[int] = []
    counts: list[int] = []
    answer: list[int] = []
    for _ in range(runs):
        started = time.perf_counter()
        generator.generate_batch(
            [prompt],
            max_length=max_tokens,
            sampling_topk=1,
            end_token=[],
            include_prompt_in_result=False,
            return_scores=True,
        )
        free_times.append(time.perf_counter() - started)
        emitted: list[int] = []
        answer = emitted
        sampling = Sampling(True, 1.0, 1, 1.0, 1.0, 0, np.random.default_rng(0))
        run = ConstrainedRun(
            matchers.matcher(GRAMMAR),
            closer,
            lambda t: tokenizer.to_pieces([t])[0],
            ends,
            tokenizer.vocab_size,
            sampling,
        )

        def generate(pieces: list[str], max_new: int, min_new: int, callback: Any) -> None:
            generator.generate_batch(
                [pieces],
                max_length=max_new,
                sampling_topk=1,
                beam_size=1,
                return_scores=True,
                return_logits_vocab=True,
                include_prompt_in_result=False,
                end_token=sorted(ends),
                min_length=min_new,
                callback=callback,
            )

        started = time.perf_counter()
        run.run(prompt, max_tokens, generate, collector(emitted))
        tight_times.append(time.perf_counter() - started)
        calls.append(run.calls)
        counts.append(len(answer))
    text = tokenizer.decode([t for t in answer if t not in ends])
    json.loads(text)  # the guarantee, checked on every bench run
    matcher = matchers.matcher(GRAMMAR)
    started = time.perf_counter()
    replayed = 0
    for token in answer:
        if token in ends:
            break
        matcher.try_consume_tokens([token])
        replayed += 1
    per_token_us = (time.perf_counter() - started) / max(replayed, 1) * 1e6
    free = median(free_times) or 0.0
    tight = median(tight_times) or 0.0
    tokens = median([float(c) for c in counts]) or 1.0
    free_same = free * tokens / max_tokens  # unconstrained time for as many tokens
    return {
        "model": key,
        "tokens": tokens,
        "unconstrained_tok_s": max_tokens / free,
        "constrained_tok_s": tokens / tight,
        "throughput_ratio": (tokens / tight) / (max_tokens / free),
        "time_ratio": tight / free_same,
        "calls_per_100_tokens": 100 * (median([float(c) for c in calls]) or 0) / tokens,
        "matcher_us_per_token": per_token_us,
        "answer": text[:80],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,json,bench,46m")
    parser.add_argument("--max-tokens", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for key in args.models.split(","):
        row = measure(key, args.max_tokens, args.runs)
        print(
            f"{row['model']:>5}: {row['tokens']:.0f} tokens | unconstrained "
            f"{row['unconstrained_tok_s']:.0f} tok/s | constrained {row['constrained_tok_s']:.0f}"
            f" tok/s (x{row['throughput_ratio']:.2f}) | time x{row['time_ratio']:.2f} | "
            f"{row['calls_per_100_tokens']:.1f} calls/100 tok | matcher "
            f"{row['matcher_us_per_token']:.1f} us/tok | {row['answer']!r}"
        )


if __name__ == "__main__":
    main()
