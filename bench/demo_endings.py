"""How long the demo model's answers run, and how they end, greedy and sampled.

    .venv/bin/python -m bench.demo_endings [--model models/demo] [--max-tokens 600]
        [--samples 1] [--seed 1]

Renders 20 one-message chats through the built-in chat template (what chat completions and
the Responses API send), generates each greedily and sampled at temperature 1 with CTranslate2
directly (as the engine does, end token on), and prints each mode's answer lengths (min, p50,
p90, max) and finish reasons: ``stop`` (the end token) or ``length`` (``max_tokens`` reached,
``incomplete`` on the Responses API). Pointing ``--model`` at a model built before the
end-of-turn circuit shows what it changed.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import ctranslate2
import numpy as np

from ops.model_builders.demo import load_tokenizer
from web.common.chat_template import ChatTurn, render_chat

PROMPTS = [
    "Hi",
    "What is the weather in Paris?",
    "Explain the socket module.",
    "How do I read a file?",
    "Return the value of the attribute.",
    "Tell me a joke",
    "What does os.path.join do?",
    "Summarize this: the quick brown fox jumps over the lazy dog.",
    "Write a haiku about Python",
    "Why is the sky blue?",
    "List three sorting algorithms.",
    "How do I parse JSON?",
    "What time is it?",
    "Create a temporary directory",
    "Is this thread safe?",
    "Convert a string to bytes",
    "Hello there, how are you today?",
    "What is a context manager?",
    "Describe the logging module in one sentence.",
    "Thanks!",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/demo"))
    parser.add_argument("--max-tokens", type=int, default=600)
    parser.add_argument("--samples", type=int, default=1, help="sampled answers per prompt")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sp = load_tokenizer(args.model / "tokenizer.model")
    generator = ctranslate2.Generator(str(args.model), device="cpu")
    prompts = [
        ["<s>", *sp.encode(render_chat([ChatTurn("user", text)]), out_type=str)] for text in PROMPTS
    ]
    print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens")
    ctranslate2.set_random_seed(args.seed)
    for mode, options in (
        ("greedy", {"sampling_topk": 1}),
        ("sampled T=1", {"sampling_topk": 0, "sampling_temperature": 1.0}),
    ):
        batch = prompts if mode == "greedy" else prompts * args.samples
        results = generator.generate_batch(
            batch, max_length=args.max_tokens, include_prompt_in_result=False, **options
        )
        ids = [result.sequences_ids[0] for result in results]
        # CTranslate2 drops the end token from the result: an answer short of the limit ended.
        reasons = Counter("length" if len(seq) >= args.max_tokens else "stop" for seq in ids)
        lengths = np.array([len(seq) for seq in ids])
        p50, p90 = np.percentile(lengths, [50, 90])
        print(
            f"{mode:12} n={len(ids)} tokens min {lengths.min()} p50 {p50:.0f} p90 {p90:.0f} "
            f"max {lengths.max()}; finish {dict(reasons)}; "
            f"over 100 tokens {int((lengths > 100).sum())}"
        )
        print(f"  e.g. {sp.decode(ids[1])!r}")
    del generator


if __name__ == "__main__":
    main()
