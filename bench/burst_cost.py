"""What a delivered token costs the serving path, per process, during a burst.

    .venv/bin/python -m bench.burst_cost [--model demo] [--clients 16] [--max-tokens 512]
        [--bursts 3] [--api openai] [--profile-dir DIR]

Starts the stack as ``bench.load`` does, sends ``--clients`` streaming requests within 50 ms
(connections opened beforehand) and charges each process's CPU time (user + system, all threads
and children: the engine process is the worker's child and is reported on its own) to the tokens
the clients received. The engine's own cost per token (``generate_batch`` of the same size, same
knobs, this process) is printed beside it, so the serving path's cost is what is left. With
``--profile-dir``, py-spy (``pip install py-spy``) records the web and worker processes during
the last burst, as speedscope files.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import models
from bench.load import engine_burst, run_burst
from bench.log import progress
from bench.params import RunParams
from bench.stack import Stack, cpu_of, process_groups, us_per_token
from worker.config import PROJECT_ROOT


def start_profilers(groups: dict[str, list[int]], out: Path) -> list[subprocess.Popen[bytes]]:
    spy = shutil.which("py-spy") or str(Path(PROJECT_ROOT) / ".venv" / "bin" / "py-spy")
    out.mkdir(parents=True, exist_ok=True)
    started = []
    for role in ("web", "worker"):
        started.append(
            subprocess.Popen(
                [spy, "record", "--pid", str(groups[role][0]), "--rate", "200", "--nonblocking",
                 "--format", "speedscope", "--output", str(out / f"{role}.speedscope.json"),
                 "--threads", "--gil"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
    time.sleep(1.0)
    return started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.burst_cost", description=__doc__)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--api", default="openai")
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
    try:
        stack.start()
        stack.start_worker(args.model)
        groups = process_groups(stack, args.model)
        window = args.window_ms / 1000
        warm = run_burst(stack.web_port, args.api, args.model, args.clients, window, 32, 99)
        asyncio.run(warm)
        for seed in range(args.bursts):
            profilers = []
            if args.profile_dir is not None and seed == args.bursts - 1:
                profilers = start_profilers(groups, args.profile_dir)
            before, wall_start = cpu_of(groups), time.monotonic()
            row = asyncio.run(
                run_burst(
                    stack.web_port, args.api, args.model, args.clients, window, args.max_tokens,
                    seed,
                )
            )  # fmt: skip
            wall = time.monotonic() - wall_start
            after = cpu_of(groups)
            for profiler in profilers:
                profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                profiler.wait(timeout=60)
            tokens = args.clients * args.max_tokens - row["errors"] * args.max_tokens
            cost = {name: (after[name] - before[name]) for name in groups}
            row["cpu_s"] = {k: round(v, 3) for k, v in cost.items()}
            row["us_per_token"] = us_per_token(cost, tokens)
            row["cores_busy"] = round(sum(cost.values()) / wall, 2)
            runs.append(row)
            progress(
                f"burst {seed}: TTFT p50 {row['ttft_ms']['p50']:.0f} max "
                f"{row['ttft_ms']['max']:.0f} ms, {row['aggregate_tokens_per_s']:.0f} tok/s, "
                f"us/token {row['us_per_token']}, cores busy {row['cores_busy']}"
            )
    finally:
        stack.close()
    result = {
        "model": args.model,
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "engine_burst": engine,
        "engine_us_per_token": round(1e6 / engine["tokens_per_s"], 1),
        "runs": runs,
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"burst-cost-{args.model}-{stamp}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
