"""Cold start: what a worker pays between its process start and taking its first job.

    .venv/bin/python -m bench.coldstart            # demo + bench models, about a minute
    .venv/bin/python -m bench.coldstart --models demo --runs 3

Three parts, each the median of ``--runs``:
1. CTranslate2's own model load (``ctranslate2.Generator``), per model and compute type: what
   the weights cost. Loading a float32 model as int8 converts it at every start; a model
   converted offline to int8 (``ct2-transformers-converter --quantization int8``) does not.
2. Trickle's engine start (tokenizer + load + one warm-up batch per engine thread).
3. A whole worker, start to first heartbeat (ready to claim), exec'ed as the Procfile line
   (`celery -A worker.app worker`) or forked from a launcher that preloaded its imports
   (what `trickle up` does, ``ops.preload``).
Writes ``bench/results/coldstart-<time>.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.harness.log import progress
from bench.harness.models import prepare
from ops.redis_server import free_port, start_redis, stop_redis
from trickle import keys
from trickle.config.sections import ModelSettings
from trickle.config.settings import PROJECT_ROOT

RESULTS = PROJECT_ROOT / "bench" / "results"
BIN = Path(sys.executable).parent
_NODES = iter(range(1_000_000))


def median_of(runs: int, measure: Callable[..., float], *args: Any) -> float:
    return statistics.median(measure(*args) for _ in range(runs))


def generator_load(path: Path, compute_type: str) -> float:
    import ctranslate2

    started = time.perf_counter()
    generator = ctranslate2.Generator(
        str(path), device="cpu", compute_type=compute_type, inter_threads=2, intra_threads=1
    )
    took = time.perf_counter() - started
    generator.unload_model()
    return took


def engine_start(path: Path) -> float:
    from worker.engine.engine import Engine

    started = time.perf_counter()
    engine = Engine(ModelSettings(name="m", path=str(path)))
    took = time.perf_counter() - started
    engine.close()
    return took


def worker_ready(config: Path, client: redis.Redis, model: str, fork: bool) -> float:
    """Start one worker, return seconds until its first heartbeat; then stop it."""
    n = next(_NODES)
    from ops.launcher import die_with_parent
    from ops.preload import ForkedProcess

    node = f"cold{n}{'f' if fork else 'e'}"
    argv = [
        str(BIN / "celery"), "-A", "worker.app", "worker", "--loglevel", "WARNING",
        "--hostname", f"{node}@%h", "--without-gossip", "--without-mingle",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRICKLE")}
    env["TRICKLE_CONFIG"] = str(config)
    started = time.monotonic()
    process: ForkedProcess | subprocess.Popen[bytes]
    if fork:
        process = ForkedProcess(argv, env, str(PROJECT_ROOT), die_with_parent)
    else:
        process = subprocess.Popen(argv, env=env, cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL)
    try:
        while not any(
            str(m).startswith(f"{node}@") for m in client.zrange(keys.model_workers(model), 0, -1)
        ):
            if process.poll() is not None:
                raise RuntimeError(f"worker exited with {process.returncode}")
            time.sleep(0.01)
        return time.monotonic() - started
    finally:
        os.kill(process.pid, 15)
        process.wait(30)
        if fork and process.stdout is not None:
            process.stdout.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.coldstart", description=__doc__)
    parser.add_argument("--models", default="demo,bench")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    from ops.preload import preload

    results: dict[str, dict[str, float]] = {}
    port = free_port()
    data = PROJECT_ROOT / ".trickle" / f"bench-coldstart-{port}"
    redis_process = start_redis(port, data, append_only=False)
    client = redis.Redis(port=port, decode_responses=True)
    models = {key: prepare(key) for key in args.models.split(",")}
    try:
        # Workers first: forking after this process ran CTranslate2 (OpenMP) could hang the
        # child, which is why `trickle up` itself never loads a model.
        for key, model in models.items():
            config = data / f"{key}.toml"
            config.write_text(
                f'default_model = "{key}"\n[redis]\nurl = "redis://127.0.0.1:{port}/0"\n'
                f'[models.{key}]\npath = "{model.path}"\n'
            )
            progress(f"{key}: worker start, exec'ed")
            row = results.setdefault(key, {})
            row["worker_exec"] = median_of(args.runs, worker_ready, config, client, key, False)
            why = preload()
            if why:
                progress(f"preloading failed: {why}")
                continue
            progress(f"{key}: worker start, forked from a preloaded launcher")
            row["worker_fork"] = median_of(args.runs, worker_ready, config, client, key, True)
    finally:
        client.close()
        stop_redis(redis_process)
    for key, model in models.items():
        progress(f"{key}: CTranslate2 load and engine start")
        row = results[key]
        row["generator_load"] = median_of(args.runs, generator_load, model.path, "default")
        if key == "demo":  # float32 on disk: int8 converts at load time
            row["generator_load_int8_at_load"] = median_of(
                args.runs, generator_load, model.path, "int8"
            )
        row["engine_start"] = median_of(args.runs, engine_start, model.path)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"coldstart-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2))
    print(render(results))
    progress(f"written {out}")
    return 0


def render(results: dict[str, dict[str, float]]) -> str:
    labels = {
        "generator_load": "CTranslate2 `Generator` load (stored type)",
        "generator_load_int8_at_load": "same, float32 converted to int8 at load",
        "engine_start": "engine start (tokenizer, load, warm-up)",
        "worker_exec": "worker start to ready, exec'ed (`celery ...`)",
        "worker_fork": "worker start to ready, forked by `trickle up`",
    }
    models = list(results)
    lines = [
        "| seconds (median) | " + " | ".join(models) + " |",
        "|---" + "|--:" * len(models) + "|",
    ]
    for name, label in labels.items():
        cells = [f"{results[m][name]:.2f}" if name in results[m] else "" for m in models]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
