"""Open-loop load, the way vLLM's ``bench serve`` measures a server.

    .venv/bin/python -m bench.load [--model demo] [--rates 0.05,0.1,0.25,0.5,1.0]
        [--rps 15] [--requests 100] [--max-tokens 128] [--api openai,jobs] [--seed 0] [--plot]

Rates are fractions of the engine's batched capacity, measured in the same run: the best
``generate_batch`` tokens/s over a few batch sizes, divided by ``--max-tokens`` (requests/s).
Each rate sends a fixed number of requests with Poisson arrivals (exponential gaps, seeded),
whatever the server does (open loop), over keep-alive connections: OpenAI streaming chat
completions (``/v1/chat/completions``, ``stream: true``) or jobs (``POST /v1/jobs`` then its SSE
stream). Per rate: TTFT, inter-token latency (ITL) and end-to-end latency at p50/p99,
throughput, and goodput (requests/s that met the SLO: TTFT <= 250 ms and every ITL <= 50 ms);
the highest rate whose p99s meet the SLO is reported as a fraction of the engine's capacity.
``--rps 15`` adds absolute rates (for A/B runs of two versions, whose capacity readings differ).
Each rate also charges every process's CPU time (web, worker, engine, Redis, this client) to the
tokens delivered. Results go to JSON (and a PNG with ``--plot``, which needs matplotlib:
``pip install matplotlib``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from bench.engine_limit import load_generator
from bench.harness import models
from bench.harness.api_requests import SLO_ITL_MS, SLO_TTFT_MS, RequestResult, sender
from bench.harness.keepalive import Connections
from bench.harness.log import progress
from bench.harness.params import RunParams
from bench.harness.stack import Stack, cpu_of, process_groups, us_per_token
from bench.harness.stats import percentile
from trickle.config.settings import PROJECT_ROOT


async def run_rate(
    port: int, api: str, model: str, rate: float, count: int, max_tokens: int, seed: int
) -> dict[str, Any]:
    conns = Connections(port)
    send = sender(api)
    rng = random.Random(seed)
    tasks = []
    began = time.perf_counter()
    for _ in range(count):
        tasks.append(asyncio.create_task(send(conns, model, max_tokens)))
        await asyncio.sleep(rng.expovariate(rate))
    results: list[RequestResult] = await asyncio.gather(*tasks)
    duration = time.perf_counter() - began
    conns.close()
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft_s * 1000 for r in ok]
    itls = [gap * 1000 for r in ok for gap in r.itls_s]
    e2es = [r.e2e_s * 1000 for r in ok]
    tokens = sum(r.tokens or len(r.arrivals) for r in ok)

    def pct(values: list[float], q: float) -> float | None:
        return percentile(values, q)

    row: dict[str, Any] = {
        "api": api,
        "rate_rps": rate,
        "requests": count,
        "errors": len(results) - len(ok),
        "error_samples": sorted({r.error for r in results if not r.ok})[:3],
        "connections_opened": conns.opened,
        "duration_s": duration,
        "ttft_ms": {"p50": pct(ttfts, 50), "p99": pct(ttfts, 99), "worst5": sorted(ttfts)[-5:]},
        "itl_ms": {"p50": pct(itls, 50), "p99": pct(itls, 99)},
        "e2e_ms": {"p50": pct(e2es, 50), "p99": pct(e2es, 99)},
        "output_tokens_per_s": tokens / duration,
        "goodput_rps": sum(r.meets_slo() for r in results) / duration,
    }
    row["meets_slo"] = (
        row["errors"] == 0
        and (row["ttft_ms"]["p99"] or 1e9) <= SLO_TTFT_MS
        and (row["itl_ms"]["p99"] or 1e9) <= SLO_ITL_MS
    )
    progress(
        f"{api} {rate:.2f} req/s: TTFT p50/p99 {row['ttft_ms']['p50'] or 0:.0f}/"
        f"{row['ttft_ms']['p99'] or 0:.0f} ms, ITL p99 {row['itl_ms']['p99'] or 0:.1f} ms, "
        f"{row['output_tokens_per_s']:.0f} tok/s, {row['errors']} errors"
    )
    return row


async def run_burst(
    port: int, api: str, model: str, clients: int, window_s: float, max_tokens: int, seed: int
) -> dict[str, Any]:
    """``clients`` requests arriving at uniform random moments within ``window_s``, their
    connections opened beforehand (as clients that keep them open would have)."""
    conns = Connections(port)
    for conn in [await conns.take() for _ in range(clients)]:
        conns.give_back(conn)
    send = sender(api)
    rng = random.Random(seed)  # one generator: a new one per draw gave every client the same moment
    offsets = sorted(rng.uniform(0, window_s) for _ in range(clients))

    async def later(offset: float) -> RequestResult:
        await asyncio.sleep(offset)
        return await send(conns, model, max_tokens)

    began = time.perf_counter()
    results = await asyncio.gather(*(later(offset) for offset in offsets))
    conns.close()
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft_s * 1000 for r in ok]
    ends = [r.arrivals[-1] for r in ok]
    firsts = [r.arrivals[0] for r in ok]
    tokens = sum(r.tokens or len(r.arrivals) for r in ok)
    row = {
        "api": api,
        "clients": clients,
        "window_ms": window_s * 1000,
        "errors": len(results) - len(ok),
        "ttft_ms": {"p50": percentile(ttfts, 50), "max": max(ttfts, default=None)},
        "itl_ms": {
            "p50": percentile([gap * 1000 for r in ok for gap in r.itls_s], 50),
            "p99": percentile([gap * 1000 for r in ok for gap in r.itls_s], 99),
        },
        "aggregate_tokens_per_s": tokens / (max(ends) - min(firsts)) if ok else 0.0,
        "tokens": tokens,
        "wall_s": time.perf_counter() - began,
    }
    progress(f"burst {api} x{clients}: {row}")
    return row


def engine_burst(model: models.PreparedModel, params: RunParams, size: int) -> dict[str, Any]:
    """CTranslate2 alone: ``generate_batch(size)``'s first step and its tokens/s."""
    pieces = models.prompt_pieces(model)
    generator = load_generator(model, params)
    first: list[float] = []

    def note(_step: Any) -> bool:
        if not first:
            first.append(time.perf_counter())
        return False

    try:
        kwargs = {"max_length": params.max_tokens, "end_token": [], "sampling_topk": 0}
        generator.generate_batch([pieces] * size, **kwargs)
        start = time.perf_counter()
        generator.generate_batch([pieces] * size, callback=note, **kwargs)
        wall = time.perf_counter() - start
    finally:
        generator.unload_model()
        del generator
    return {
        "batch": size,
        "first_step_ms": (first[0] - start) * 1000,
        "tokens_per_s": size * params.max_tokens / wall,
    }


def engine_capacity(model: models.PreparedModel, params: RunParams) -> dict[str, Any]:
    """The engine's best batched tokens/s (CTranslate2 alone, same knobs as the worker): each
    size is run once to warm it, then twice, keeping the faster (a size's first run pays its
    allocations, and one reading on a shared machine can land on a busy moment)."""
    pieces = models.prompt_pieces(model)
    generator = load_generator(model, params)
    best: dict[str, Any] = {"batch": 0, "tokens_per_s": 0.0}
    try:
        kwargs = {"max_length": params.max_tokens, "end_token": [], "sampling_topk": 0}
        generator.generate_batch([pieces], **kwargs)
        for size in (1, 8, 16, 32):
            generator.generate_batch([pieces] * size, **kwargs)
            for _ in range(2):
                start = time.perf_counter()
                generator.generate_batch([pieces] * size, **kwargs)
                rate = size * params.max_tokens / (time.perf_counter() - start)
                if rate > best["tokens_per_s"]:
                    best = {"batch": size, "tokens_per_s": rate}
    finally:
        generator.unload_model()
        del generator
    best["requests_per_s"] = best["tokens_per_s"] / params.max_tokens
    progress(f"engine batched capacity: {best}")
    return best


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for api in sorted({row["api"] for row in result["rows"]}):
        rows = [row for row in result["rows"] if row["api"] == api]
        x = [row["fraction_of_capacity"] for row in rows]
        left.plot(x, [row["ttft_ms"]["p99"] or 0 for row in rows], marker="o", label=api)
        right.plot(x, [row["goodput_rps"] for row in rows], marker="o", label=api)
    left.axhline(SLO_TTFT_MS, linestyle="--", color="grey", label="SLO")
    left.set(xlabel="offered rate / engine capacity", ylabel="TTFT p99 (ms)", yscale="log")
    right.set(xlabel="offered rate / engine capacity", ylabel="goodput (req/s)")
    for axis in (left, right):
        axis.legend()
        axis.grid(alpha=0.3)
    fig.suptitle(f"{result['model']}: open-loop Poisson, {result['max_tokens']} output tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--rates", default="0.05,0.1,0.25,0.5,1.0")
    parser.add_argument(
        "--rps", default="", help="absolute rates (req/s), run after --rates (e.g. 15 for A/B runs)"
    )
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--api", default="openai,jobs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", action="store_true")
    parser.add_argument("--burst", type=int, default=16, help="clients in the burst (0: none)")
    parser.add_argument("--burst-window-ms", type=float, default=50.0)
    parser.add_argument(
        "--env", action="append", default=[], help="KEY=VALUE for the stack (repeatable)"
    )
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = models.prepare(args.model)
    params = RunParams(max_tokens=args.max_tokens)
    capacity = engine_capacity(model, params)
    engine_16 = engine_burst(model, params, args.burst) if args.burst else {}
    stack = Stack(args.out / f"work-load-{args.model}", model, params, args.max_tokens)
    stack.extra_env = dict(item.split("=", 1) for item in args.env)
    rows = []
    bursts = []
    try:
        stack.start()
        stack.start_worker(args.model)
        for api in args.api.split(","):
            asyncio.run(run_rate(stack.web_port, api, args.model, 5.0, 5, args.max_tokens, 99))
            if args.burst:
                window = args.burst_window_ms / 1000
                for seed in range(3):
                    burst = run_burst(
                        stack.web_port, api, args.model, args.burst, window, args.max_tokens, seed
                    )
                    bursts.append(asyncio.run(burst))
            groups = process_groups(stack, args.model)
            for rate in _rates(args.rates, args.rps, capacity["requests_per_s"]):
                before = cpu_of(groups)
                row = asyncio.run(
                    run_rate(
                        stack.web_port, api, args.model, rate, args.requests, args.max_tokens,
                        args.seed,
                    )
                )  # fmt: skip
                row["cpu_us_per_token"] = _cpu_per_token(before, cpu_of(groups), row)
                fraction = rate / capacity["requests_per_s"]
                rows.append({"fraction_of_capacity": fraction, **row})
    finally:
        stack.close()
    goodput = {
        api: max(
            (r["fraction_of_capacity"] for r in rows if r["api"] == api and r["meets_slo"]),
            default=0.0,
        )
        for api in args.api.split(",")
    }
    result = {
        "model": args.model,
        "parameters": model.parameters,
        "max_tokens": args.max_tokens,
        "engine_capacity": capacity,
        "slo": {"ttft_p99_ms": SLO_TTFT_MS, "itl_p99_ms": SLO_ITL_MS},
        "rows": rows,
        "highest_rate_meeting_slo_fraction": goodput,
        "engine_burst": engine_16,
        "bursts": bursts,
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.out / f"load-{args.model}-{stamp}.json"
    path.write_text(json.dumps(result, indent=2))
    if args.plot:
        plot(result, args.out / f"load-{args.model}.png")
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "bursts")}, indent=2))
    for b in bursts:
        print(
            f"burst {b['api']:6s} x{b['clients']} in {b['window_ms']:.0f} ms: TTFT "
            f"p50 {b['ttft_ms']['p50'] or 0:.0f} max {b['ttft_ms']['max'] or 0:.0f} ms, "
            f"{b['aggregate_tokens_per_s']:.0f} tok/s, {b['errors']} errors"
        )
    for row in rows:
        print(
            f"{row['api']:6s} {row['fraction_of_capacity']:.2f}x ({row['rate_rps']:.2f} req/s): "
            f"TTFT p50 {row['ttft_ms']['p50'] or 0:.0f} p99 {row['ttft_ms']['p99'] or 0:.0f} ms "
            f"(worst five {', '.join(f'{t:.0f}' for t in row['ttft_ms']['worst5'])}), "
            f"ITL p50 {row['itl_ms']['p50'] or 0:.1f} p99 {row['itl_ms']['p99'] or 0:.1f} ms, "
            f"{row['output_tokens_per_s']:.0f} tok/s, goodput {row['goodput_rps']:.2f} req/s, "
            f"{row['errors']} errors"
        )
        print(f"         CPU us per delivered token: {row['cpu_us_per_token']}")
    return 0


def _rates(fractions: str, absolute: str, capacity_rps: float) -> list[float]:
    """Request rates to run: fractions of the engine's capacity, then absolute req/s."""
    rates = [float(f) * capacity_rps for f in fractions.split(",") if f.strip()]
    return rates + [float(r) for r in absolute.split(",") if r.strip()]


def _cpu_per_token(
    before: dict[str, float], after: dict[str, float], row: dict[str, Any]
) -> dict[str, float]:
    """Each process group's CPU time over the run, per token the clients received."""
    tokens = row["output_tokens_per_s"] * row["duration_s"]
    return us_per_token({name: after[name] - before[name] for name in after}, tokens)


if __name__ == "__main__":
    sys.exit(main())
