"""What a delivered token costs the serving path, per process, during a burst.

    .venv/bin/python -m bench.burst_cost [--model demo] [--clients 16] [--max-tokens 512]
        [--bursts 3] [--api job,ws,openai,messages] [--profile-dir DIR]

Starts the stack as ``bench.load`` does and, for each API in turn (native SSE, WebSocket,
streamed OpenAI chat) on the same stack, sends ``--clients`` streaming requests within 50 ms
(connections opened beforehand) and charges each process's CPU time (user + system, all threads
and children: the engine process is the worker's child and is reported on its own) to the tokens
the clients received. The engine's own cost per token (``generate_batch`` of the same size, same
knobs, this process) is printed beside it, so the serving path's cost is what is left. With
``--profile-dir``, py-spy (``pip install py-spy``) records the web and worker processes during
the last burst, as speedscope files. The last lines give, per API, the median serving path
(web + worker + Redis) per token beside the engine's own CPU per token in the same stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from bench.harness import models
from bench.harness.log import progress
from bench.harness.params import RunParams
from bench.harness.profiling import profiled
from bench.harness.stack import Stack, cpu_of, process_groups, us_per_token
from bench.load import engine_burst, run_burst
from trickle.config.settings import PROJECT_ROOT


def measure_burst(
    stack: Stack,
    groups: dict[str, list[int]],
    api: str,
    args: argparse.Namespace,
    window: float,
    seed: int,
) -> dict[str, Any]:
    """One burst of ``args.clients`` streams on ``api``, with every process's CPU charged to the
    tokens the clients received."""
    before, wall_start = cpu_of(groups), time.monotonic()
    row = asyncio.run(
        run_burst(stack.web_port, api, args.model, args.clients, window, args.max_tokens, seed)
    )
    wall = time.monotonic() - wall_start
    after = cpu_of(groups)
    # What the clients counted: a Messages stream may end before max_tokens (no ignore_eos).
    tokens = row["tokens"]
    cost = {name: (after[name] - before[name]) for name in groups}
    row["cpu_s"] = {k: round(v, 3) for k, v in cost.items()}
    row["us_per_token"] = us_per_token(cost, tokens)
    row["cores_busy"] = round(sum(cost.values()) / wall, 2)
    progress(
        f"{api} burst {seed}: TTFT p50 {row['ttft_ms']['p50']:.0f} max "
        f"{row['ttft_ms']['max']:.0f} ms, {row['aggregate_tokens_per_s']:.0f} tok/s, "
        f"us/token {row['us_per_token']}, cores busy {row['cores_busy']}"
    )
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over an API's bursts (the first, which warms the stack's caches, left out when
    there are more)."""
    rows = rows[1:] if len(rows) > 2 else rows

    def median(values: list[float]) -> float:
        ordered = sorted(values)
        return round(ordered[len(ordered) // 2], 1)

    cost = {k: median([r["us_per_token"][k] for r in rows]) for k in ("web", "worker", "redis")}
    serving = round(sum(cost.values()), 1)
    engine = median([r["us_per_token"]["engine"] for r in rows])
    return {
        **cost,
        "serving_us_per_token": serving,
        "engine": engine,
        "serving_vs_engine": round(serving / engine, 2) if engine else None,
        "ttft_p50_ms": median([r["ttft_ms"]["p50"] for r in rows]),
        "itl_p99_ms": median([r["itl_ms"]["p99"] or 0.0 for r in rows]),
        "tokens_per_s": median([r["aggregate_tokens_per_s"] for r in rows]),
        "bursts": len(rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.burst_cost", description=__doc__)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument(
        "--api", default="job,ws,openai", help="job (SSE), ws, openai (chat), messages (Anthropic)"
    )
    parser.add_argument("--window-ms", type=float, default=50.0)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the stack")
    parser.add_argument("--profile-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = models.prepare(args.model)
    params = RunParams(max_tokens=args.max_tokens)
    engine = engine_burst(model, params, args.clients)
    progress(f"engine generate_batch({args.clients}): {engine}")
    stack = Stack(args.out / f"work-burst-{args.model}", model, params, args.max_tokens)
    stack.extra_env = dict(item.split("=", 1) for item in args.env)
    runs: list[dict[str, Any]] = []
    apis = [api.strip() for api in args.api.split(",") if api.strip()]
    try:
        stack.start()
        stack.start_worker(args.model)
        groups = process_groups(stack, args.model)
        window = args.window_ms / 1000
        for api in apis:
            warm = run_burst(stack.web_port, api, args.model, args.clients, window, 32, 99)
            asyncio.run(warm)
            for seed in range(args.bursts):
                last = api == apis[-1] and seed == args.bursts - 1
                with profiled(groups, args.profile_dir if last else None):
                    runs.append(measure_burst(stack, groups, api, args, window, seed))
    finally:
        stack.close()
    engine_us = round(1e6 / engine["tokens_per_s"], 1)
    result = {
        "model": args.model,
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "engine_burst": engine,
        "engine_us_per_token": engine_us,
        "runs": runs,
        "summary": {api: summary([r for r in runs if r["api"] == api]) for api in apis},
    }
    for api, row in result["summary"].items():
        progress(
            f"{api}: serving path {row['serving_us_per_token']} us/token (web {row['web']}, "
            f"worker {row['worker']}, redis {row['redis']}) = {row['serving_vs_engine']} x the "
            f"engine's own {row['engine']} us/token in the stack (median of {row['bursts']} "
            f"bursts); TTFT p50 {row['ttft_p50_ms']} ms, ITL p99 {row['itl_p99_ms']} ms"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"burst-cost-{args.model}-{stamp}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
