"""How often the int8 SmolLM2 that `make up` serves writes what the float32 conversion writes.

    .venv/bin/python -m bench.int8_agreement [--max-tokens 32] [--threads 1]

Builds (or reuses) models/smollm2 (int8) and models/smollm2-float32 from the same cached wheel,
renders 24 one-message chats with the model's own chat template, generates each greedily with
CTranslate2 directly (one prompt at a time, ending on the model's end tokens) and prints: how
many answers are identical, and for the others how many tokens agree before the first difference.
The float32 conversion is the one tests/system/test_smollm2.py checks against a NumPy reference.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ctranslate2
import jinja2
from tokenizers import Tokenizer

from ops.model_builders.smollm2 import build_smollm2
from trickle.config.settings import PROJECT_ROOT, SMOLLM2_MODEL_DIR, WHEEL_CACHE_DIR

FLOAT32_DIR = PROJECT_ROOT / "models" / "smollm2-float32"
PROMPTS = [
    "What is the capital of France?",
    "Hi",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Name three primary colors.",
    "Explain what a CPU does in one sentence.",
    "Translate 'good morning' into Spanish.",
    "Give me a synonym for happy.",
    "Write a Python function that adds two numbers.",
    "Why is the sky blue?",
    "What is the boiling point of water in Celsius?",
    "Tell me a joke.",
    "Who wrote Romeo and Juliet?",
    "List the days of the week.",
    "What is photosynthesis?",
    "How many legs does a spider have?",
    "Summarize: the cat sat on the mat all afternoon.",
    "What does HTTP stand for?",
    "Suggest a name for a pet goldfish.",
    "What is the largest planet in the solar system?",
    "Convert 5 kilometers to meters.",
    "What is a prime number?",
    "Describe the color green to someone.",
    "Write one sentence about autumn.",
]


def greedy_answers(
    model_dir: Path, prompts: list[list[str]], end_ids: list[int], max_tokens: int, threads: int
) -> list[list[int]]:
    generator = ctranslate2.Generator(str(model_dir), device="cpu", intra_threads=threads)
    answers = [
        generator.generate_batch(
            [tokens],
            max_length=max_tokens,
            sampling_topk=1,
            include_prompt_in_result=False,
            end_token=end_ids,
        )[0].sequences_ids[0]
        for tokens in prompts
    ]
    del generator
    return answers


def agreed_prefix(a: list[int], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    int8_dir = build_smollm2(SMOLLM2_MODEL_DIR, WHEEL_CACHE_DIR, progress=print)
    float32_dir = build_smollm2(
        FLOAT32_DIR, WHEEL_CACHE_DIR, quantization="float32", progress=print
    )
    tokenizer = Tokenizer.from_file(str(int8_dir / "tokenizer.json"))
    template = jinja2.Template(
        json.loads((int8_dir / "tokenizer_config.json").read_text())["chat_template"]
    )
    end_ids = json.loads((int8_dir / "generation_config.json").read_text())["eos_token_id"]
    prompts = [
        tokenizer.encode(
            template.render(messages=[{"role": "user", "content": p}], add_generation_prompt=True)
        ).tokens
        for p in PROMPTS
    ]
    int8 = greedy_answers(int8_dir, prompts, end_ids, args.max_tokens, args.threads)
    float32 = greedy_answers(float32_dir, prompts, end_ids, args.max_tokens, args.threads)
    same = sum(a == b for a, b in zip(int8, float32, strict=True))
    print(f"identical greedy answers: {same}/{len(PROMPTS)} (up to {args.max_tokens} tokens)")
    for prompt, a, b in zip(PROMPTS, int8, float32, strict=True):
        if a != b:
            print(
                f"  {prompt!r}: {agreed_prefix(a, b)} tokens agree, then\n"
                f"    int8:    {tokenizer.decode(a)!r}\n    float32: {tokenizer.decode(b)!r}"
            )


if __name__ == "__main__":
    main()
