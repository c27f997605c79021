"""One command: the engine's own limit and Trickle end to end, side by side.

    .venv/bin/python -m bench.run [--quick] [--model demo,bench] [--clients 4,16,32]
                                  [--fanout 100,1000,5000] [--max-tokens 128] [--out DIR]

Progress goes to stderr, the markdown table to stdout and ``<out>/latest.md``, the raw numbers to
``<out>/<model>-<timestamp>.json``. Every process started (Redis, Celery workers, gunicorn, the
fan-out client) is stopped before exit, on errors and on Ctrl-C / SIGTERM too.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from bench import e2e, engine_limit, fanout, paired, roundtrips
from bench.harness import models, report
from bench.harness.log import progress
from bench.harness.params import RunParams
from bench.harness.stack import HOST, Stack, raise_open_files_limit, unbatched_name
from bench.harness.sysinfo import machine_info
from trickle.config.settings import PROJECT_ROOT

DEFAULT_OUT = PROJECT_ROOT / "bench" / "results"
FANOUT_TOKENS_CAP = 16384
FANOUT_RUN_SECONDS_AFTER_WINDOW = 30.0


@dataclass(frozen=True)
class Plan:
    models: list[str]
    vocab_size: int | None
    quick: bool
    max_tokens: int
    engine_stream_runs: int
    engine_batch_sizes: list[int]
    engine_batch_reps: int
    single_runs: int
    clients: list[int]
    roundtrip_clients: int
    fanout: list[int]
    fanout_jobs: int
    fanout_window_s: float
    fanout_max_tokens: int | None
    healthz_probes: int
    out: Path
    env: dict[str, str]  # extra environment of the stack's processes (--env KEY=VALUE)


def _ints(text: str) -> list[int]:
    if text.strip().lower() in ("", "0", "none", "off"):
        return []
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> tuple[Plan, RunParams]:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke run")
    parser.add_argument("--model", default="demo,bench", help="demo, bench, gpt2 (comma list)")
    parser.add_argument("--clients", help="concurrent streams (default 4,16,32; quick 4)")
    parser.add_argument("--fanout", help="SSE readers per web process (default 100,1000,5000)")
    parser.add_argument("--max-tokens", type=int, help="new tokens per request (128; quick 32)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    parser.add_argument("--runs", type=int, help="repeated single-stream runs (30; quick 5)")
    parser.add_argument("--engine-batch", help="generate_batch sizes (default 1,4,16,32)")
    parser.add_argument("--fanout-jobs", type=int, default=4, help="jobs the readers follow")
    parser.add_argument("--fanout-window", type=float, help="seconds measured (10; quick 2)")
    parser.add_argument("--fanout-max-tokens", type=int, help="default: sized from the engine")
    parser.add_argument("--healthz-probes", type=int, help="GET /healthz per state (50; q 10)")
    parser.add_argument("--batch-size", type=int, help="max_batch_size, batched (max clients)")
    parser.add_argument("--batch-wait-ms", type=float, help="max_batch_wait_ms (Trickle's 2.0)")
    parser.add_argument("--intra-threads", type=int, help="CTranslate2 intra_threads (0)")
    parser.add_argument("--compute-type", help="CTranslate2 compute_type (default)")
    parser.add_argument(
        "--env", action="append", default=[], help="KEY=VALUE for the stack (repeatable)"
    )
    parser.add_argument(
        "--vocab", type=int, help="vocabulary of the random models (8000; 2000 = tokenizer's)"
    )
    args = parser.parse_args(argv)

    quick: bool = args.quick
    wanted = [m.strip() for m in args.model.split(",") if m.strip()]
    unknown = [m for m in wanted if m not in models.CHOICES]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {sorted(models.CHOICES)}")
    clients = _ints(args.clients or ("4" if quick else "4,16,32"))
    plan = Plan(
        models=wanted,
        vocab_size=args.vocab,
        quick=quick,
        max_tokens=args.max_tokens or (32 if quick else 128),
        engine_stream_runs=args.runs or (5 if quick else 30),
        engine_batch_sizes=_ints(args.engine_batch or ("1,4,16" if quick else "1,4,16,32")),
        engine_batch_reps=1 if quick else 3,
        single_runs=args.runs or (5 if quick else 30),
        clients=clients,
        roundtrip_clients=16 if 16 in clients else max(clients, default=0),
        fanout=_ints(args.fanout or ("20,100" if quick else "100,1000,5000")),
        fanout_jobs=args.fanout_jobs,
        fanout_window_s=args.fanout_window or (2.0 if quick else 10.0),
        fanout_max_tokens=args.fanout_max_tokens,
        healthz_probes=args.healthz_probes or (10 if quick else 50),
        out=args.out,
        env=dict(item.split("=", 1) for item in args.env),
    )
    defaults = RunParams()
    params = RunParams(
        max_tokens=plan.max_tokens,
        max_batch_size=args.batch_size or max([*clients, 1]),
        max_batch_wait_ms=(
            args.batch_wait_ms if args.batch_wait_ms is not None else defaults.max_batch_wait_ms
        ),
        intra_threads=(
            args.intra_threads if args.intra_threads is not None else defaults.intra_threads
        ),
        compute_type=args.compute_type or defaults.compute_type,
    )
    return plan, params


def phase(store: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    """Run one measurement; an exception is recorded under ``name`` instead of ending the run."""
    try:
        value = fn()
    except Exception as exc:
        progress(f"{name} failed: {exc!r}")
        traceback.print_exc(file=sys.stderr)
        store[name] = {"error": repr(exc)}
        return None
    store[name] = value
    return value


def fanout_tokens(plan: Plan, engine: dict[str, Any]) -> int:
    """Long enough that the jobs outlive the measurement, from the engine's own rate."""
    if plan.fanout_max_tokens:
        return plan.fanout_max_tokens
    rates = {int(b["n"]): b.get("tokens_per_s") for b in engine.get("generate_batch") or []}
    size = plan.fanout_jobs if plan.fanout_jobs in rates else 1
    aggregate = rates.get(size)
    if not aggregate:
        return 8192
    per_job = aggregate / size
    wanted = int(per_job * (plan.fanout_window_s + FANOUT_RUN_SECONDS_AFTER_WINDOW))
    return max(2 * plan.max_tokens, min(wanted, FANOUT_TOKENS_CAP))


def bench_model(
    key: str, plan: Plan, params: RunParams, result: dict[str, Any], stamp: str
) -> None:
    progress(f"=== model {key}: preparing")
    model = models.prepare(key, plan.vocab_size)
    pieces = models.prompt_pieces(model)
    result.update(
        {
            "model": {
                "key": key,
                "path": str(model.path),
                "parameters": model.parameters,
                "description": model.choice.description,
            },
            "params": params.to_dict(),
            "device": params.resolved_device(),
            "prompt": models.PROMPT,
            "prompt_tokens": len(pieces),
        }
    )
    progress(f"=== model {key}: engine limit (direct CTranslate2)")
    engine = (
        phase(
            result,
            "engine",
            lambda: engine_limit.measure(
                model,
                pieces,
                params,
                plan.engine_stream_runs,
                plan.engine_batch_sizes,
                plan.engine_batch_reps,
            ),
        )
        or {}
    )
    long_tokens = fanout_tokens(plan, engine)
    trickle: dict[str, Any] = {}
    result["trickle"] = trickle
    stack = Stack(
        plan.out / f"work-{key}-{stamp}", model, params, max(long_tokens, params.max_tokens)
    )
    stack.extra_env = dict(plan.env)
    result["work_dir"] = str(stack.work_dir)
    try:
        progress(f"=== model {key}: Trickle stack")
        stack.start()
        run_trickle(stack, key, plan, params, trickle, long_tokens, pieces)
    except Exception as exc:
        progress(f"Trickle phase failed: {exc!r}")
        traceback.print_exc(file=sys.stderr)
        trickle["error"] = repr(exc)
    finally:
        stack.close()


def run_trickle(
    stack: Stack,
    key: str,
    plan: Plan,
    params: RunParams,
    out: dict[str, Any],
    long_tokens: int,
    pieces: list[str],
) -> None:
    body = params.job_body(key, models.PROMPT)
    stack.start_worker(key)
    phase(
        out,
        "single_stream",
        lambda: e2e.single_streams(HOST, stack.web_port, body, plan.single_runs),
    )
    phase(
        out,
        "paired",
        lambda: paired.measure(
            stack.model, pieces, params, HOST, stack.web_port, body, plan.single_runs
        ),
    )
    batched: dict[str, Any] = {}
    out["batched"] = batched
    for n in plan.clients:
        if n == plan.roundtrip_clients:

            def measured(n: int = n) -> dict[str, Any]:
                assert stack.client is not None
                result, counts = roundtrips.measure(
                    stack.client,
                    stack.redis_url,
                    params.max_tokens,
                    lambda: e2e.concurrent(HOST, stack.web_port, body, n, stack.pids()),
                )
                out["roundtrips"] = counts
                return result

            phase(batched, str(n), measured)
        else:
            phase(
                batched,
                str(n),
                partial(e2e.concurrent, HOST, stack.web_port, body, n, stack.pids()),
            )
    stack.stop_worker(key)

    naive = unbatched_name(key)
    naive_body = params.job_body(naive, models.PROMPT)
    unbatched: dict[str, Any] = {}
    out["unbatched"] = unbatched
    if plan.clients:
        stack.start_worker(naive)
        e2e.warm_up(HOST, stack.web_port, naive_body)
        for n in plan.clients:
            phase(
                unbatched,
                str(n),
                partial(e2e.concurrent, HOST, stack.web_port, naive_body, n, stack.pids()),
            )
        stack.stop_worker(naive)

    runs: list[dict[str, Any]] = []
    out["fanout"] = runs
    for readers in plan.fanout:
        progress(f"=== model {key}: fan-out, {readers} readers, {plan.fanout_jobs} jobs")
        holder: dict[str, Any] = {}
        value = phase(
            holder,
            "run",
            partial(
                fanout.run_one,
                stack,
                key,
                partial(params.job_body, key, models.PROMPT, long_tokens),
                readers,
                plan.fanout_jobs,
                plan.fanout_window_s,
                plan.healthz_probes,
            ),
        )
        runs.append(value if value is not None else {"readers": readers, **holder["run"]})


class Interrupted(BaseException):
    """SIGTERM or SIGHUP: like Ctrl-C, it ends the run (cleanly) instead of one phase."""


_interrupted = False


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    """The first Ctrl-C / SIGTERM / SIGHUP ends the run; later ones must not cut the clean-up."""
    global _interrupted
    name = signal.Signals(signum).name
    if _interrupted:
        progress(f"{name} ignored: stopping the processes started (bounded, ~15 s each)")
        return
    _interrupted = True
    raise Interrupted(name)


def main(argv: list[str] | None = None) -> int:
    plan, params = parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _on_signal)
    limit = raise_open_files_limit(2 * max([*plan.fanout, 0]) + 1024)
    if plan.fanout and limit < max(plan.fanout) + 512:
        progress(f"warning: only {limit} open files allowed; large fan-out runs may fail")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    arguments = sys.argv[1:] if argv is None else argv
    started = time.monotonic()
    run: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": shlex.join([".venv/bin/python", "-m", "bench.run", *arguments]),
        "quick": plan.quick,
        "plan": {k: v for k, v in plan.__dict__.items() if k != "out"},
        "machine": machine_info(),
        "models": {},
    }
    status = 0
    try:
        for key in plan.models:
            result: dict[str, Any] = {}
            run["models"][key] = result
            bench_model(key, plan, params, result, stamp)
    except (KeyboardInterrupt, Interrupted) as exc:
        progress(f"interrupted ({exc!r}); writing what was measured")
        run["interrupted"] = True
        status = 130
    run["duration_s"] = time.monotonic() - started
    run["models"] = {k: v for k, v in run["models"].items() if v.get("model")}
    paths = report.write(run, plan.out, stamp)
    print(report.markdown(run))
    progress("wrote " + ", ".join(str(p) for p in paths))
    return status


if __name__ == "__main__":
    sys.exit(main())
