"""Poisson arrivals on the scheduler and the engine alone: how long a newcomer waits to start.

    .venv/bin/python -m bench.admission [--model 46m] [--loads 0.15,0.3] [--jobs 60]
        [--max-tokens 128] [--seed 1]

The worker's scheduler (``scheduler_for``), engine process and publisher with the
model's default knobs on a private Redis, as ``bench.scheduler_burst`` wires them; no HTTP, no
Celery. The engine's capacity is CTranslate2's own ``generate_batch(32)`` tokens/s in the same
process, divided by ``--max-tokens``; each load is a fraction of it. Jobs (greedy,
``ignore_eos``, ``--max-tokens`` each) arrive open-loop at the seeded times of
``bench.harness.arrivals``, so a run before and after a change replays the same arrivals, and
``bench.engine_arrivals`` replays them on CTranslate2 alone.

Reported per load: TTFT (arrival to first token) p50, p99 and the worst five, and ITL p99: the
gap between a job's consecutive tokens as the scheduler hands them to the publisher (the
engine side of what a client receives; the publisher's pacing adds its flush interval on top).
The worst gaps are what a restart's catch-up costs the running streams. TTFT is also given in
the job's own steps (its mean gap between tokens), with the jobs past four steps: the
machine's speed at the moment cancels out of that figure, so runs on a shared machine compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from bench.harness import models
from bench.harness.arrivals import add_arrival_options, poisson_offsets
from bench.harness.capacity import batch_capacity
from bench.harness.log import progress
from bench.scheduler_burst import claimed_job
from ops.redis_server import free_port, start_redis, stop_redis
from trickle.config.sections import ModelSettings
from trickle.config.settings import PROJECT_ROOT
from trickle.config.tuning import ModelTuning, TuningSettings
from trickle.store.job_store import JobStore
from worker.engine.engine import Engine
from worker.engine.scheduler import BatchScheduler
from worker.engine.scheduler_setup import scheduler_for
from worker.publish_items import TokenItem
from worker.publisher import TokenPublisher


class TokenTimes:
    """When each job's tokens left the scheduler (wraps the publisher's step sink)."""

    def __init__(self, sink: Any):
        self._sink = sink
        self._lock = threading.Lock()
        self.times: dict[str, list[float]] = defaultdict(list)

    def publish_step(self, tokens: tuple[TokenItem, ...]) -> None:
        now = time.monotonic()
        with self._lock:
            for item in tokens:
                self.times[item.event.job_id].append(now)
        self._sink(tokens)


def own_step(stamps: list[float]) -> float:
    """A job's mean gap between tokens, first to last: the step time it saw (a median would
    read the engine's coalesced steps, several to a message, as gaps of nothing)."""
    return max((stamps[-1] - stamps[0]) / (len(stamps) - 1), 1e-4) if len(stamps) > 1 else 1e-4


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def one_load(
    engine: Engine,
    store: JobStore,
    scheduler: BatchScheduler,
    times: TokenTimes,
    rate: float,
    jobs: int,
    tokens: int,
    seed: int,
) -> dict[str, Any]:
    """``jobs`` arrivals at ``rate`` per second (Poisson): TTFT and ITL figures in ms."""
    burst = [claimed_job(engine, store, tokens) for _ in range(jobs)]
    arrivals: dict[str, float] = {}
    start = time.monotonic()
    restarts = scheduler.restarts
    for job, offset in zip(burst, poisson_offsets(rate, jobs, seed), strict=True):
        pause = start + offset - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        arrivals[job.job_id] = time.monotonic()
        scheduler.submit(job)
    for job in burst:
        if not job.ended.wait(600):
            raise RuntimeError(f"job {job.job_id} did not end")
    ttfts = sorted(1000 * (times.times[j][0] - arrivals[j]) for j in arrivals)
    # TTFT in the job's own steps (its mean gap): what admission "within a step or two"
    # means, and a figure the machine's speed at the moment cancels out of.
    in_steps = sorted(
        (times.times[job][0] - arrivals[job]) / own_step(times.times[job]) for job in arrivals
    )
    itls = [
        1000 * (later - earlier)
        for j in arrivals
        for earlier, later in zip(times.times[j], times.times[j][1:], strict=False)
    ]
    return {
        "rate_per_s": rate,
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p99_ms": percentile(ttfts, 0.99),
        "ttft_worst5_ms": ttfts[-5:],
        "ttft_steps_p50": statistics.median(in_steps),
        "ttft_steps_p99": percentile(in_steps, 0.99),
        "late_jobs": sum(1 for steps in in_steps if steps > 4),
        "itl_p99_ms": percentile(itls, 0.99),
        "itl_max_ms": max(itls),
        "restarts": scheduler.restarts - restarts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.admission", description=__doc__)
    add_arrival_options(parser, "0.15,0.3")
    parser.add_argument(
        "--overflow-lanes-per-device",
        type=int,
        default=None,
        help="spare lanes (default: the model's)",
    )
    parser.add_argument(
        "--wait-ratio", type=float, default=None, help="rebatch_wait_ratio (default: the model's)"
    )
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    model = models.prepare(args.model)
    capacity = args.capacity
    if capacity is None:
        best = batch_capacity(model.path, models.prompt_pieces(model), args.max_tokens)
        capacity = best.tokens_per_s / args.max_tokens
        progress(f"CTranslate2 alone, best generate_batch(32): {capacity:.2f} jobs/s")
        progress(f"({best.tokens_per_s:.0f} tokens/s, {best.describe()}), as bench.outside")
    result: dict[str, Any] = {
        "model": args.model,
        "capacity_per_s": capacity,
        "overflow_lanes_per_device": args.overflow_lanes_per_device,
        "wait_ratio": args.wait_ratio,
        "loads": {},
    }
    with tempfile.TemporaryDirectory() as scratch:
        port = free_port()
        server = start_redis(port, Path(scratch), append_only=False)
        client = redis.Redis(port=port, decode_responses=True)
        knobs: dict[str, Any] = {}
        if args.overflow_lanes_per_device is not None:
            knobs["overflow_lanes_per_device"] = args.overflow_lanes_per_device
        if args.wait_ratio is not None:
            knobs["rebatch_wait_ratio"] = args.wait_ratio
        tuning = ModelTuning(**knobs)
        engine = Engine(ModelSettings(model.key, str(model.path), device="cpu", tuning=tuning))
        store = JobStore(client, 600, 600)
        publisher = TokenPublisher.paced_as(
            TuningSettings(), store, lambda _job_id: None, lambda _job_id: None
        )
        times = TokenTimes(publisher.publish_step)
        scheduler = scheduler_for(engine, times.publish_step)
        try:
            one_load(engine, store, scheduler, times, capacity * 0.2, 4, args.max_tokens, 0)
            for load in (float(value) for value in args.loads.split(",") if value.strip()):
                figures = one_load(
                    engine,
                    store,
                    scheduler,
                    times,
                    capacity * load,
                    args.jobs,
                    args.max_tokens,
                    args.seed,
                )
                result["loads"][f"{load:g}"] = figures
                worst = ", ".join(f"{value:.0f}" for value in figures["ttft_worst5_ms"])
                print(
                    f"{args.model} spare lanes {engine.lanes.spare} {load:g}x "
                    f"({figures['rate_per_s']:.2f} jobs/s): TTFT p50 "
                    f"{figures['ttft_p50_ms']:.0f} ms, p99 {figures['ttft_p99_ms']:.0f} ms, "
                    f"worst five {worst}; ITL p99 {figures['itl_p99_ms']:.0f} ms "
                    f"(max {figures['itl_max_ms']:.0f}); {figures['restarts']} restarts; TTFT in "
                    f"the job's own steps p50 {figures['ttft_steps_p50']:.1f}, p99 "
                    f"{figures['ttft_steps_p99']:.0f}, {figures['late_jobs']} jobs past 4 steps",
                    flush=True,
                )
        finally:
            scheduler.close()
            publisher.close()
            engine.close()
            client.close()
            stop_redis(server)
    source = "given" if args.capacity else "CTranslate2 generate_batch(32)"
    print(f"{args.model}: capacity {capacity:.2f} jobs/s ({source})")
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"admission-{args.model}-spare{args.overflow_lanes_per_device}-ratio{args.wait_ratio}"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
