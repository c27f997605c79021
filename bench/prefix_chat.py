"""A chat with a long shared system prompt against the same chat without it, end to end.

    .venv/bin/python -m bench.prefix_chat [--model bench] [--system-tokens 1250] [--chats 12]
        [--max-tokens 32] [--out DIR]

Starts the stack as ``bench.load`` does and sends OpenAI streaming chat completions one at a
time (keep-alive connection, nothing else running): ``--chats`` chats that share one system
prompt of about ``--system-tokens`` tokens, each with its own user turn, then the same user
turns alone. Prints the time to first token of each, and the p50 of the shared-prompt chats
after the first two (the first is remembered, the second teaches the worker the common prefix
and caches it: see worker/engine/prefix.py) beside the p50 without the system prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from bench.engine_limit import load_generator
from bench.harness import models
from bench.harness.keepalive import Connections, exchange
from bench.harness.log import progress
from bench.harness.params import RunParams
from bench.harness.stack import Stack
from bench.harness.stats import percentile
from trickle.config.settings import PROJECT_ROOT
from trickle.tokenization.sentencepiece_tokenizer import SentencePieceTokenizer

WORDS = [
    "the",
    "socket",
    "module",
    "returns",
    "a",
    "list",
    "of",
    "values",
    "for",
    "each",
    "item",
    "in",
    "the",
    "table",
    "and",
]


def system_prompt(model: models.PreparedModel, tokens: int) -> str:
    """Docstring-flavoured text of about ``tokens`` tokens (as the model's tokenizer counts)."""
    tokenizer = SentencePieceTokenizer(model.tokenizer_path, add_bos=False)
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words))) < tokens:
        words.extend(WORDS[(len(words) * 7) % len(WORDS)] for _ in range(50))
    while len(tokenizer.encode(" ".join(words))) > tokens:
        words.pop()
    return "You are a helpful assistant. " + " ".join(words)


async def chat_ttft(
    conns: Connections, model: str, messages: list[dict[str, str]], max_tokens: int
) -> float:
    body: dict[str, Any] = {
        "model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
        "temperature": 0, "ignore_eos": True,
    }  # fmt: skip
    start = time.perf_counter()
    status, lines = await exchange(conns, "POST", "/v1/chat/completions", body)
    first = None
    async for line in lines:
        if first is None and line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[6:])
            if (chunk.get("choices") or [{}])[0].get("delta", {}).get("content"):
                first = time.perf_counter()
    if status != 200 or first is None:
        raise RuntimeError(f"chat failed: status {status}")
    return (first - start) * 1000


async def run(port: int, model: str, system: str, chats: int, max_tokens: int) -> dict[str, Any]:
    conns = Connections(port)
    users = [f"Question {i}: what does item {i * 13 % 97} return?" for i in range(chats)]
    for _ in range(3):  # warm the path (and the engine's allocations for short prompts)
        await chat_ttft(conns, model, [{"role": "user", "content": "Hello"}], max_tokens)
    shared = []
    for user in users:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        shared.append(await chat_ttft(conns, model, messages, max_tokens))
    alone = [
        await chat_ttft(conns, model, [{"role": "user", "content": u}], max_tokens) for u in users
    ]
    conns.close()
    later = percentile(shared[2:], 50) or 0.0
    alone_p50 = percentile(alone, 50) or 1.0
    return {
        "shared_ttft_ms": shared,
        "alone_ttft_ms": alone,
        "shared_after_first_two_p50_ms": later,
        "alone_p50_ms": alone_p50,
        "ratio": later / alone_p50,
    }


def engine_alone(model: models.PreparedModel, system: str, user: str) -> dict[str, float]:
    """CTranslate2 alone, same knobs as the worker: the chat's time to first token with the
    system prompt as a cached static prompt (a hit), prefilled with the turn, and without it."""
    tokenizer = SentencePieceTokenizer(model.tokenizer_path, add_bos=True)
    template = f"System: {system}\nUser: {user}\nAssistant:"
    whole = tokenizer.to_pieces(tokenizer.encode(template))
    head = len(tokenizer.encode(f"System: {system}")) - 4
    alone = tokenizer.to_pieces(tokenizer.encode(f"User: {user}\nAssistant:"))
    generator = load_generator(model, RunParams())

    def ttft(prompt: list[str], static: list[str] | None = None) -> float:
        first: list[float] = []

        def note(_step: Any) -> bool:
            first.append(time.perf_counter())
            return True

        start = time.perf_counter()
        generator.generate_batch(
            [prompt], max_length=2, sampling_topk=1, include_prompt_in_result=False,
            end_token=[], static_prompt=static, callback=note,
        )  # fmt: skip
        return (first[0] - start) * 1000

    try:
        ttft(whole[head:], whole[:head])  # computes and caches the static prompt
        runs = [(ttft(whole[head:], whole[:head]), ttft(whole), ttft(alone)) for _ in range(5)]
    finally:
        generator.unload_model()
    hit, full, short = (sorted(column)[2] for column in zip(*runs, strict=True))
    return {"cached_ttft_ms": hit, "uncached_ttft_ms": full, "without_system_ttft_ms": short}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prefix_chat", description=__doc__)
    parser.add_argument("--model", default="bench")
    parser.add_argument("--system-tokens", type=int, default=1250)
    parser.add_argument("--chats", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = models.prepare(args.model)
    system = system_prompt(model, args.system_tokens)
    engine = engine_alone(model, system, "what does item 3 return?")
    progress(f"CTranslate2 alone: {engine}")
    stack = Stack(args.out / f"work-prefix-{args.model}", model, RunParams(), 2048)
    try:
        stack.start()
        stack.start_worker(args.model)
        row = asyncio.run(run(stack.web_port, args.model, system, args.chats, args.max_tokens))
    finally:
        stack.close()
    row["engine_alone"] = engine
    progress(f"shared system prompt ({args.system_tokens} tokens): {json.dumps(row)}")
    print(
        f"{args.model}: chat with a {args.system_tokens}-token system prompt, after the first "
        f"two: TTFT p50 {row['shared_after_first_two_p50_ms']:.0f} ms; the same chat without "
        f"it: {row['alone_p50_ms']:.0f} ms ({row['ratio']:.2f}x); first two: "
        f"{row['shared_ttft_ms'][0]:.0f}, {row['shared_ttft_ms'][1]:.0f} ms\n"
        f"CTranslate2 alone, same model and run: cached {engine['cached_ttft_ms']:.0f} ms, "
        f"uncached {engine['uncached_ttft_ms']:.0f} ms, without the system prompt "
        f"{engine['without_system_ttft_ms']:.0f} ms"
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"prefix-{args.model}-{stamp}.json").write_text(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
