"""The bound CTranslate2 alone reaches on the same arrivals as ``bench.admission`` and
``bench.outside``: what a deployment without Trickle would serve.

    .venv/bin/python -m bench.engine_arrivals [--model 46m] [--loads 0.15,0.3,0.5] [--jobs 60]
        [--max-tokens 128] [--seed 1] [--capacity JOBS_PER_S]
        [--policies static1,static2,call2,call4,call8] [--out DIR]

The arrivals are ``bench.harness.arrivals``'s (the same seed, load and capacity give the same
times as the other two), each a greedy, ``ignore_eos`` job of ``--max-tokens`` on "The socket
module", fed straight to a ``ctranslate2.Generator`` in this process: no Trickle, no Redis.
CTranslate2 cannot add a row to a running batch (its issue 1333), so the policies are the ones a
person could deploy on it (``bench.harness.engine_slots``):

- ``static<R>``: R replicas (``inter_threads`` R); a free replica takes everything waiting as one
  ``generate_batch`` call, so a newcomer waits for a whole running call;
- ``call<K>``: one call per arrival, K at once (``inter_threads`` K), each job alone, started as
  soon as a slot is free.

The Generator is built as the worker builds it (``bench.engine_limit.load_generator``: the
model's compute type hint, ``intra_threads`` the cores over the replicas). Tokens are timed by
``generate_batch``'s step callback, which CTranslate2 calls for every row as each greedy step's
token comes out, so TTFT is arrival to the job's first token, as a client would see it from an
engine that streamed.

Reported per policy and load: TTFT p50/p99, ITL p99, tokens/s (first arrival to last token)
and goodput against issue 53's goals (``bench.harness.goodput``). The capacity is CTranslate2's
best ``generate_batch(32)`` tokens/s over ``--max-tokens``, measured here unless given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import ctranslate2

from bench.engine_limit import load_generator
from bench.harness import models
from bench.harness.arrivals import add_arrival_options, poisson_offsets
from bench.harness.capacity import batch_capacity
from bench.harness.engine_slots import ArrivedJob, Call, SlotPolicy, SlotPool, parse_policy
from bench.harness.goodput import figures, goals_for
from bench.harness.log import progress
from bench.harness.params import RunParams
from trickle.config.sections import available_cores, derive_threads
from trickle.config.settings import PROJECT_ROOT

WARM_TOKENS = 8


def engine_call(generator: ctranslate2.Generator, pieces: list[str], max_tokens: int) -> Call:
    """One greedy ``generate_batch`` for a slot's jobs, each row's tokens timed as they come."""

    def run(batch: list[ArrivedJob]) -> None:
        def on_step(step: ctranslate2.GenerationStepResult) -> bool:
            batch[step.batch_id].token_times.append(time.perf_counter())
            return False

        generator.generate_batch(
            [pieces] * len(batch),
            max_length=max_tokens,
            sampling_topk=1,
            beam_size=1,
            include_prompt_in_result=False,
            end_token=[],
            callback=on_step,
        )

    return run


def policy_generator(model: models.PreparedModel, policy: SlotPolicy) -> ctranslate2.Generator:
    """A Generator with one replica per slot and the worker's rule for the threads under it."""
    inter, intra = derive_threads(policy.slots, 0, available_cores())
    return load_generator(model, RunParams(inter_threads=inter, intra_threads=intra))


def serve(pool: SlotPool, offsets: list[float]) -> list[ArrivedJob]:
    """Submit a job at each offset from now (open loop), then wait until all are served."""
    jobs = [ArrivedJob(index) for index in range(len(offsets))]
    start = time.perf_counter()
    for job, offset in zip(jobs, offsets, strict=True):
        pause = start + offset - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        pool.submit(job)
    pool.close()
    return jobs


def run_policy(
    model: models.PreparedModel,
    policy: SlotPolicy,
    pieces: list[str],
    loads: list[float],
    capacity: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    generator = policy_generator(model, policy)
    try:
        # Every replica's first call allocates: one short call per slot, twice, before timing.
        warm = SlotPool(policy, engine_call(generator, pieces, WARM_TOKENS))
        serve(warm, [0.0] * 2 * policy.slots)
        rows: dict[str, Any] = {}
        for load in loads:
            rate = capacity * load
            pool = SlotPool(policy, engine_call(generator, pieces, args.max_tokens))
            jobs = serve(pool, poisson_offsets(rate, args.jobs, args.seed))
            row = figures(jobs, goals_for(load), capacity)
            row.update(rate_per_s=rate, mean_call_jobs=statistics.mean(pool.calls))
            rows[f"{load:g}"] = row
            progress(
                f"{policy.name} {load:g}x: TTFT p99 {row['ttft_p99_ms']:.0f} ms, "
                f"{row['good_jobs']}/{row['jobs']} jobs met the goals"
            )
    finally:
        generator.unload_model()
        del generator
    return {"describe": policy.describe(), "loads": rows}


def print_table(model: str, capacity: float, source: str, result: dict[str, Any]) -> None:
    print(f"\n## {model}: CTranslate2 alone on the same arrivals, capacity {capacity:.2f} jobs/s")
    print(f"({source})\n")
    print(
        "| policy | load | jobs/s | TTFT p50 | TTFT p99 | ITL p99 | tok/s | jobs met both goals "
        "| goodput x capacity | jobs per call |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for name, policy in result.items():
        for load, row in policy["loads"].items():
            print(
                f"| {name} | {load}x | {row['rate_per_s']:.2f} | {row['ttft_p50_ms']:.0f} ms | "
                f"{row['ttft_p99_ms']:.0f} ms | {row['itl_p99_ms']:.0f} ms | "
                f"{row['tokens_per_s']:.0f} | {row['good_jobs']}/{row['jobs']} "
                f"(TTFT ≤ {row['ttft_goal_ms']:.0f}, ITL ≤ {row['itl_goal_ms']:.0f}) | "
                f"{row['goodput_x_capacity']:.2f} | {row['mean_call_jobs']:.1f} |"
            )
    print()
    for name, policy in result.items():
        print(f"- {name}: {policy['describe']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_arrivals", description=__doc__)
    add_arrival_options(parser, "0.15,0.3,0.5")
    parser.add_argument("--policies", default="static1,static2,call2,call4,call8")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    try:
        policies = [parse_policy(name.strip()) for name in args.policies.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    loads = [float(value) for value in args.loads.split(",") if value.strip()]
    model = models.at_path(Path(args.model)) if "/" in args.model else models.prepare(args.model)
    pieces = models.prompt_pieces(model)
    if args.capacity is None:
        best = batch_capacity(model.path, pieces, args.max_tokens)
        capacity = best.tokens_per_s / args.max_tokens
        source = f"CTranslate2 generate_batch(32), {best.tokens_per_s:.0f} tok/s, {best.describe()}"
    else:
        capacity, source = args.capacity, "given"
    progress(f"capacity {capacity:.2f} jobs/s ({source})")
    result = {
        policy.name: run_policy(model, policy, pieces, loads, capacity, args) for policy in policies
    }
    print_table(args.model, capacity, source, result)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"engine-arrivals-{model.key}-seed{args.seed}.json"
    summary = {
        "model": args.model,
        "capacity_per_s": capacity,
        "capacity_source": source,
        "seed": args.seed,
        "jobs": args.jobs,
        "max_tokens": args.max_tokens,
        "policies": result,
    }
    out.write_text(json.dumps(summary, indent=2))
    progress(f"raw figures: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
