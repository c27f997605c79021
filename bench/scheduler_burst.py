"""A 16-job burst on the scheduler and the engine alone: what batching costs without the stack.

    .venv/bin/python -m bench.scheduler_burst [--model bench] [--jobs 16] [--spread-ms 0,25]
        [--bursts 8] [--max-tokens 64]

The worker's scheduler (``scheduler_for``, as a worker builds it), engine process
and publisher, with the model's default knobs, on a private Redis; no HTTP, no Celery, no web
tier. Each burst hands ``--jobs`` claimed jobs to the scheduler, all at once or spread evenly
over a window (a burst reaches the scheduler over the 20-50 ms its claims take in the stack),
and reports, per spread, the TTFT p50 and max from each job's arrival and the burst's
tokens/s, beside CTranslate2's own ``generate_batch(jobs)`` (its first step and tokens/s) in the
same process.

Set beside ``bench.burst_trace`` (the same burst through the whole stack), the difference is
what the stack's other processes cost a burst on the cores the engine shares with them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench.harness import models
from bench.harness.log import progress
from bench.harness.params import RunParams
from bench.load import engine_burst
from ops.redis_server import free_port, start_redis, stop_redis
from trickle.config.sections import ModelSettings
from trickle.config.settings import PROJECT_ROOT
from trickle.config.tuning import TuningSettings
from trickle.jobs import Job, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import JobStore
from worker.engine.engine import Engine
from worker.engine.new_job import make_scheduled_job
from worker.engine.scheduler import BatchScheduler, ScheduledJob
from worker.engine.scheduler_setup import scheduler_for
from worker.publisher import TokenPublisher


def claimed_job(engine: Engine, store: JobStore, max_tokens: int) -> ScheduledJob:
    """A job stored and claimed as a worker would, so its writes carry a real fence."""
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    record = Job(new_job_id(), engine.settings.name, models.PROMPT, params, created_at=time.time())
    store.create(record)
    claim = store.leases.claim(record.id, "bench", time.time(), 600_000, 3)
    ids = engine.tokenizer.encode(record.prompt)
    return make_scheduled_job(engine, record.id, ids, params, claim.fence)


def one_burst(
    engine: Engine,
    store: JobStore,
    scheduler: BatchScheduler,
    jobs: int,
    spread: float,
    tokens: int,
) -> dict[str, float]:
    burst = [claimed_job(engine, store, tokens) for _ in range(jobs)]
    arrivals: list[float] = []
    began = time.time()
    for index, job in enumerate(burst):
        pause = began + spread * index / max(jobs - 1, 1) - time.time()
        if pause > 0:
            time.sleep(pause)
        arrivals.append(time.time())
        scheduler.submit(job)
    for job in burst:
        if not job.ended.wait(600):
            raise RuntimeError(f"job {job.job_id} did not end")
    ttfts = [
        1000 * (job.first_token_at - arrived)
        for job, arrived in zip(burst, arrivals, strict=True)
        if job.first_token_at is not None
    ]
    firsts = [job.first_token_at for job in burst if job.first_token_at is not None]
    lasts = [job.last_token_at for job in burst if job.last_token_at is not None]
    return {
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_max_ms": max(ttfts),
        "tokens_per_s": jobs * tokens / (max(lasts) - min(firsts)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler_burst", description=__doc__)
    parser.add_argument("--model", default="bench")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--spread-ms", default="0,25", help="arrival windows (comma list)")
    parser.add_argument("--bursts", type=int, default=8, help="per spread (one warm-up more)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    model = models.prepare(args.model)
    params = RunParams(max_tokens=args.max_tokens)
    reference = engine_burst(model, params, args.jobs)
    progress(f"CTranslate2 alone, generate_batch({args.jobs}): {reference}")
    spreads = [float(value) / 1000 for value in args.spread_ms.split(",") if value.strip()]
    result: dict[str, Any] = {"model": args.model, "engine_burst": reference, "spreads": {}}
    with tempfile.TemporaryDirectory() as scratch:
        port = free_port()
        server = start_redis(port, Path(scratch), append_only=False)
        client = redis.Redis(port=port, decode_responses=True)
        engine = Engine(ModelSettings(model.key, str(model.path), device="cpu"))
        store = JobStore(client, 600, 600)
        # Paced as a worker paces its flushes by default.
        publisher = TokenPublisher.paced_as(
            TuningSettings(), store, lambda _job_id: None, lambda _job_id: None
        )
        scheduler = scheduler_for(engine, publisher.publish_step)
        try:
            for spread in spreads:
                one_burst(engine, store, scheduler, args.jobs, spread, args.max_tokens)  # warm-up
                rows = []
                for _ in range(args.bursts):
                    time.sleep(0.5)
                    rows.append(
                        one_burst(engine, store, scheduler, args.jobs, spread, args.max_tokens)
                    )
                summary = {
                    name: statistics.median(row[name] for row in rows)
                    for name in ("ttft_p50_ms", "ttft_max_ms", "tokens_per_s")
                }
                result["spreads"][f"{spread * 1000:g}"] = {"median": summary, "bursts": rows}
        finally:
            scheduler.close()
            publisher.close()
            engine.close()
            client.close()
            stop_redis(server)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"scheduler-burst-{args.model}.json").write_text(json.dumps(result, indent=2))
    first_step = reference["first_step_ms"]
    print(
        f"{args.model}: CTranslate2 alone, generate_batch({args.jobs}): first step "
        f"{first_step:.1f} ms, {reference['tokens_per_s']:.0f} tokens/s"
    )
    for spread, figures in result["spreads"].items():
        median = figures["median"]
        above = median["ttft_p50_ms"] - first_step
        print(
            f"  {args.jobs} jobs over {spread} ms, median of {args.bursts} bursts: TTFT p50 "
            f"{median['ttft_p50_ms']:.1f} ms (first step + {above:.1f})"
            f", max {median['ttft_max_ms']:.1f} ms, {median['tokens_per_s']:.0f} tokens/s "
            f"({median['tokens_per_s'] / reference['tokens_per_s']:.2f}x the engine)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
