"""Trickle on the real default model, each figure a ratio to CTranslate2 alone in the same run.

    .venv/bin/python -m bench.real_model [--max-tokens 64] [--pairs 5] [--chats 10] [--json]

The model is SmolLM2-135M-Instruct as `make up` serves it (models/smollm2, int8; built from the
cached wheel when missing). One stack (embedded Redis, gunicorn, one Celery worker serving
``smollm2`` and ``demo``, as `make up` runs them), and in this process a ``ctranslate2.Generator``
on the same directory, compute type and threads (``bench.engine_limit``). It prints:

- one stream: Trickle's tokens/s over the engine's ``generate_tokens``, paired back to back
  (``bench.paired``; goal at least 0.9);
- a 16-stream burst: the aggregate tokens/s of 16 streams started together over the engine's
  best ``generate_batch`` of 16 on this machine (``bench.harness.capacity``, as
  ``bench.outside`` takes its bound: the best of compute types and 1-2 intra threads; goal at
  least 0.85), and beside it over one ``generate_batch`` of 16 on the worker's own compute
  type and threads (one lane's share: Trickle's lanes spread a burst over both cores, so that
  ratio is no bound);
- a short chat's TTFT p50 over streamed ``/v1/chat/completions`` against the engine's own
  prefill of the same rendered prompt (its first ``generate_tokens`` step) + 20 ms;
- the stack's resident memory with both models loaded (web, worker and engine processes,
  Redis), after the runs.

Each job asks for exactly the engine's sampling and length (``ignore_eos``), as every bench here.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import e2e, engine_limit, paired
from bench.harness.capacity import Capacity, batch_capacity
from bench.harness.log import progress
from bench.harness.models import ModelChoice, PreparedModel
from bench.harness.params import RunParams
from bench.harness.stack import HOST, Stack, child_pids, rss_kib, tree_pids
from bench.harness.stats import median
from ops import stack as ops_stack
from trickle.config.sections import ModelSettings
from trickle.config.settings import DEFAULT_MODEL_DIR, SMOLLM2_MODEL_DIR, WHEEL_CACHE_DIR
from trickle.model_files import model_profile
from trickle.tokenization import load_tokenizer
from web.common.chat_template import ChatTurn, render_chat

MODEL = "smollm2"
BURST = 16
# A short chat, as the browser page or an SDK sends one.
CHAT = [ChatTurn("user", "What is the capital of France?")]
# The TTFT goal: the engine's own prefill of the same prompt plus this.
TTFT_ALLOWANCE_MS = 20.0
PARAMETERS = 134_515_008  # SmolLM2-135M: tied embeddings, 30 layers


def prepare_smollm2() -> PreparedModel:
    from ops.model_builders.smollm2 import build_smollm2

    path = build_smollm2(SMOLLM2_MODEL_DIR, WHEEL_CACHE_DIR)
    choice = ModelChoice(MODEL, "smollm2", None, "SmolLM2-135M-Instruct, int8 (models/smollm2)")
    return PreparedModel(choice, path, PARAMETERS)


def encode_pieces(model: PreparedModel, text: str) -> list[str]:
    """The prompt as the worker encodes it, as the pieces CTranslate2 takes."""
    tokenizer = load_tokenizer(ModelSettings(MODEL, str(model.path)))
    return tokenizer.to_pieces(tokenizer.encode(text))


def chat_pieces(model: PreparedModel) -> list[str]:
    """The short chat rendered by the model's own template, as the web tier renders it."""
    profile = model_profile(ModelSettings(MODEL, str(model.path)))
    text = render_chat(
        CHAT, profile.chat_template, profile.bos_token, profile.eos_token, drop_bos=False
    )
    return encode_pieces(model, text)


def chat_ttft_s(host: str, port: int, max_tokens: int) -> float | None:
    """Seconds from the POST to the first content delta of a streamed chat completion."""
    body = {
        "model": MODEL,
        "messages": [{"role": turn.role, "content": turn.content} for turn in CHAT],
        "max_tokens": max_tokens,
        "stream": True,
    }
    connection = http.client.HTTPConnection(host, port, timeout=120)
    try:
        started = time.perf_counter()
        connection.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        first: float | None = None
        for line in response:
            if first is None and line.startswith(b"data: {") and _has_text(line[6:]):
                first = time.perf_counter() - started
        return first
    finally:
        connection.close()


def _has_text(data: bytes) -> bool:
    """Whether a chat chunk carries answer text (the first one only names the role)."""
    choices = json.loads(data).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


def engine_figures(
    model: PreparedModel, pieces: list[str], chat: list[str], params: RunParams, runs: int
) -> dict[str, float | None]:
    """CTranslate2 alone on the worker's compute type and threads: one batch-16's tokens/s and
    the chat prompt's prefill (first step)."""
    generator = engine_limit.load_generator(model, params)
    try:
        # With a step callback, as the worker runs its batches; the first call is a warm-up.
        engine_limit.batch_once(generator, pieces, params, BURST, with_callback=True)
        wall, tokens = engine_limit.batch_once(generator, pieces, params, BURST, True)
        one_token = RunParams(**{**params.to_dict(), "max_tokens": 1})
        prefill = [engine_limit.stream_once(generator, chat, one_token)[0] for _ in range(runs)]
    finally:
        generator.unload_model()
        del generator
    return {"batch16_tokens_per_s": tokens / wall, "chat_prefill_ms": 1000 * (median(prefill) or 0)}


def burst_bound(model: PreparedModel, pieces: list[str], params: RunParams) -> Capacity:
    """The burst's bound: the engine's best ``generate_batch(16)`` of the same prompt and
    length on this machine (``bench.harness.capacity``, greedy)."""
    best = batch_capacity(model.path, pieces, params.max_tokens, size=BURST)
    progress(
        f"engine alone, best batch {BURST}: {best.tokens_per_s:,.0f} tok/s ({best.describe()})"
    )
    return best


def stack_rss_mib(stack: Stack, worker_pid: int) -> float:
    """Web, worker (with its engine processes) and Redis: what `make up` keeps resident."""
    pids = [*stack.web_pids(), *tree_pids(worker_pid), stack.pids().get("redis", 0)]
    return sum(rss_kib(pid) or 0 for pid in pids if pid) / 1024


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = prepare_smollm2()
    params = RunParams(max_tokens=args.max_tokens)
    pieces = encode_pieces(model, "The socket module")
    chat = chat_pieces(model)
    with tempfile.TemporaryDirectory(prefix="trickle-real-") as work:
        stack = Stack(Path(work), model, params, ceiling=args.max_tokens)
        with stack.config_path.open("a") as config:
            config.write(f'\n[models.demo]\npath = "{DEFAULT_MODEL_DIR}"\n')
        try:
            stack.start()
            worker = ops_stack.start_worker(
                ops_stack.child_env(stack.config_path, stack.extra_env),
                stack.redis_url,
                "bench-real",
                (MODEL, "demo"),
                stack.log_dir / "worker.log",
                timeout=300,
            )
            try:
                progress(f"worker serving {MODEL} and demo up (pid {worker.pid})")
                body = params.job_body(MODEL, "The socket module")
                e2e.warm_up(HOST, stack.web_port, body)
                one = paired.measure(model, pieces, params, HOST, stack.web_port, body, args.pairs)
                burst = e2e.concurrent(HOST, stack.web_port, body, BURST)
                ttfts = [chat_ttft_s(HOST, stack.web_port, 4) for _ in range(args.chats)]
                rss = stack_rss_mib(stack, worker.pid)
                engine_children = len(child_pids(worker.pid))
            finally:
                ops_stack.stop(worker)
        finally:
            stack.close()
    engine = engine_figures(model, pieces, chat, params, args.chats)
    best = burst_bound(model, pieces, params)
    chat_ms = [1000 * t for t in ttfts if t is not None]
    return {
        "params": params.to_dict(),
        "one_stream_ratio": one["tokens_per_s_ratio"]["p50"],
        "one_stream": one,
        "burst16_tokens_per_s": burst["aggregate_tokens_per_s"],
        "burst16_failed": burst["failed"],
        "engine_batch16_tokens_per_s": engine["batch16_tokens_per_s"],
        "engine_best_batch16_tokens_per_s": best.tokens_per_s,
        "engine_best_batch16": best.describe(),
        "chat_ttft_p50_ms": median(chat_ms),
        "chat_prompt_tokens": len(chat),
        "engine_chat_prefill_ms": engine["chat_prefill_ms"],
        "stack_rss_mib": rss,
        "worker_children": engine_children,
    }


def report(result: dict[str, Any]) -> str:
    burst = result["burst16_tokens_per_s"] or 0.0
    engine_burst = result["engine_batch16_tokens_per_s"]
    best_burst = result["engine_best_batch16_tokens_per_s"]
    ttft = result["chat_ttft_p50_ms"] or float("nan")
    goal = result["engine_chat_prefill_ms"] + TTFT_ALLOWANCE_MS
    rows = [
        ("one stream, tokens/s x the engine's", f"{result['one_stream_ratio'] or 0:.3f}", ">= 0.9"),
        (
            f"{BURST}-stream burst, tokens/s x the engine's best batch-{BURST} "
            f"({result['engine_best_batch16']})",
            f"{burst / best_burst:.3f} ({burst:.0f} / {best_burst:.0f})",
            ">= 0.85",
        ),
        (
            f"{BURST}-stream burst, tokens/s x one batch-{BURST} on the worker's threads",
            f"{burst / engine_burst:.3f} ({burst:.0f} / {engine_burst:.0f})",
            "(no bound)",
        ),
        (
            f"short chat TTFT p50 ({result['chat_prompt_tokens']} prompt tokens)",
            f"{ttft:.1f} ms (x {ttft / goal:.2f} the goal)",
            f"<= {goal:.1f} ms (prefill {result['engine_chat_prefill_ms']:.1f} + 20)",
        ),
        ("stack RSS, smollm2 + demo loaded", f"{result['stack_rss_mib']:.0f} MiB", ""),
    ]
    lines = ["| figure | Trickle | goal |", "|---|--:|--:|"]
    lines += [f"| {name} | {value} | {goal_text} |" for name, value, goal_text in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=5, help="single-stream pairs")
    parser.add_argument("--chats", type=int, default=10, help="chats for the TTFT p50")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = parser.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2, default=str) if args.json else report(result))


if __name__ == "__main__":
    main(sys.argv[1:])
