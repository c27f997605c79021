"""Where a burst's time to first token goes, hop by hop, per job.

    .venv/bin/python -m bench.burst_trace [--model demo] [--clients 16] [--window-ms 50]
        [--max-tokens 128] [--bursts 6] [--env KEY=VALUE ...] [--rows]

Starts the stack as ``bench.load`` does, sends ``--bursts`` bursts of streaming chat requests
(connections opened beforehand, arrival moments uniform over the window) and, for every job,
reads the moments its own record keeps (``created_at``: the web tier stored it; ``started_at``:
a worker claimed it; ``first_token_at``: the worker published its first token) beside the
client's (sent; first token read). It prints each hop's p50 / p90 / max over all jobs:

    sent -> created          the web tier: HTTP, validation, tokenization, the job record
    created -> claimed       the queue: the task message, the worker's take, its claim
    claimed -> first token   the scheduler and the engine: batch wait, restarts, first step
    first token -> client    the token plane: Redis pub/sub, the web tier's write, the client

All moments come from one machine's clock; nothing here adds work to the stack under test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import redis

from bench.harness import models
from bench.harness.keepalive import Connections, exchange
from bench.harness.log import progress
from bench.harness.params import RunParams
from bench.harness.stack import Stack
from bench.harness.stats import percentile
from trickle import keys
from trickle.config.settings import PROJECT_ROOT

HOPS = {
    "sent -> created": ("sent", "created"),
    "created -> claimed": ("created", "claimed"),
    "claimed -> first token": ("claimed", "published"),
    "first token -> client": ("published", "first"),
    "sent -> client (TTFT)": ("sent", "first"),
}


async def one_request(
    conns: Connections, model: str, max_tokens: int, offset: float
) -> dict[str, Any]:
    await asyncio.sleep(offset)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": models.PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    moments: dict[str, Any] = {"sent": time.time()}
    _status, lines = await exchange(conns, "POST", "/v1/chat/completions", body)
    async for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        moments.setdefault("id", chunk.get("id"))
        choices = chunk.get("choices") or [{}]
        if choices[0].get("delta", {}).get("content") and "first" not in moments:
            moments["first"] = time.time()
    return moments


async def burst(
    port: int, model: str, clients: int, window_s: float, max_tokens: int, seed: int
) -> list[dict[str, Any]]:
    conns = Connections(port)
    for conn in [await conns.take() for _ in range(clients)]:
        conns.give_back(conn)
    rng = random.Random(seed)
    offsets = sorted(rng.uniform(0, window_s) for _ in range(clients))
    results = await asyncio.gather(
        *(one_request(conns, model, max_tokens, offset) for offset in offsets)
    )
    conns.close()
    return list(results)


def job_moments(client: redis.Redis, moments: dict[str, Any]) -> dict[str, float]:
    """The client's moments plus the job record's, all as unix times."""
    job_id = str(moments.get("id") or "").removeprefix("chatcmpl-")
    if not job_id.startswith("job_"):
        job_id = f"job_{job_id}"
    fields = client.hmget(keys.job(job_id), ["created_at", "started_at", "first_token_at"])
    found = {
        name: float(value)
        for name, value in zip(("created", "claimed", "published"), fields, strict=True)
        if value is not None
    }
    return {**{k: v for k, v in moments.items() if k in ("sent", "first")}, **found}


def summarize(rows: list[dict[str, float]]) -> dict[str, dict[str, float | None]]:
    summary = {}
    for hop, (start, end) in HOPS.items():
        spans = [1000 * (row[end] - row[start]) for row in rows if start in row and end in row]
        summary[hop] = {
            "p50": percentile(spans, 50),
            "p90": percentile(spans, 90),
            "max": max(spans, default=None),
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.burst_trace", description=__doc__)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--window-ms", type=float, default=50.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--bursts", type=int, default=6)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the stack")
    parser.add_argument("--rows", action="store_true", help="print every job's moments")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    model = models.prepare(args.model)
    env = dict(item.split("=", 1) for item in args.env)
    stack = Stack(args.out / "burst-trace-stack", model, RunParams(max_tokens=args.max_tokens), 512)
    rows: list[dict[str, float]] = []
    try:
        stack.extra_env = env
        stack.start()
        stack.start_worker(model.key)
        client = redis.Redis.from_url(stack.redis_url, decode_responses=True)
        asyncio.run(burst(stack.web_port, model.key, 4, 0.01, 8, seed=99))  # warm-up
        for index in range(args.bursts):
            time.sleep(1.0)
            results = asyncio.run(
                burst(
                    stack.web_port,
                    model.key,
                    args.clients,
                    args.window_ms / 1000,
                    args.max_tokens,
                    index,
                )
            )
            these = [job_moments(client, moments) for moments in results]
            ttfts = [1000 * (r["first"] - r["sent"]) for r in these if "first" in r]
            progress(
                f"burst {index}: TTFT p50 {percentile(ttfts, 50):.1f} ms, max {max(ttfts):.1f} ms"
            )
            if args.rows:
                start = min(r["sent"] for r in these)
                for row in sorted(these, key=lambda r: r["sent"]):
                    print({k: round(1000 * (v - start), 1) for k, v in row.items()})
            rows.extend(these)
    finally:
        stack.close()
    summary = summarize(rows)
    print(f"{args.model}: {len(rows)} jobs in {args.bursts} bursts of {args.clients}, ms")
    for hop, figures in summary.items():
        print(f"  {hop:24s} " + "  ".join(f"{k} {v:7.1f}" for k, v in figures.items() if v))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"burst-trace-{args.model}.json"
    out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "hops": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
