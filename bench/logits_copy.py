"""What reporting alternatives costs: one stream with and without ``return_logits_vocab`` (and
the alternatives computed from it, as the engine process does for ``top_logprobs``), on the
same model in the same run. Only jobs that ask pay this.

    python -m bench.logits_copy [--models demo,bench,46m] [--tokens 128] [--runs 5]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import ctranslate2

from bench.harness.models import prepare, prompt_pieces
from bench.harness.stats import median
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer
from worker.engine.alternatives import row_logits, scored
from worker.engine.model_hints import resolve_compute_type


def stream_seconds(
    generator: ctranslate2.Generator, prompt: list[str], tokens: int, texts: list[str] | None
) -> float:
    def callback(step: Any) -> bool:
        if texts is not None:
            logits = row_logits(step)
            if logits is not None:
                scored(logits, int(step.token_id), 20, 1.0, texts)
        return False

    started = time.perf_counter()
    generator.generate_batch(
        [prompt],
        max_length=tokens,
        sampling_topk=1,
        end_token=[],
        return_scores=True,
        include_prompt_in_result=False,
        return_logits_vocab=texts is not None,
        callback=callback,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,bench,46m")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for key in args.models.split(","):
        model = prepare(key)
        path = model.path
        generator = ctranslate2.Generator(
            str(path),
            device="cpu",
            compute_type=resolve_compute_type(path, "auto"),
            intra_threads=1,
        )
        tokenizer = SentencePieceTokenizer(model.tokenizer_path)
        texts = [t.decode("utf-8", "replace") for t in tokenizer.token_bytes()]
        prompt = prompt_pieces(model)
        plain: list[float] = []
        with_top: list[float] = []
        for _ in range(args.runs):  # interleaved, so drift hits both alike
            plain.append(stream_seconds(generator, prompt, args.tokens, None))
            with_top.append(stream_seconds(generator, prompt, args.tokens, texts))
        a, b = median(plain) or 0.0, median(with_top) or 0.0
        extra_us = (b - a) / args.tokens * 1e6
        print(
            f"{key:>5}: {a / args.tokens * 1e3:.3f} ms/token plain, "
            f"{b / args.tokens * 1e3:.3f} with top_logprobs=20 (+{extra_us:.0f} us/token, "
            f"x{b / a:.2f})"
        )


if __name__ == "__main__":
    main()
