"""How long a job that arrives while a batch runs waits for its first token.

CTranslate2 cannot add a sequence to a running ``generate_batch``, so Trickle's options are a
second batch on another engine thread (``inter_threads``) or waiting for the batch to end.
This measures both, in-process (engine + scheduler + publisher + a real Redis, no HTTP):
a batch of ``--batch`` long jobs starts, ``--delay`` later one short job arrives; we report the
newcomer's time to first token and the long batch's aggregate tokens/s.

    .venv/bin/python -m bench.join [--model demo|bench] [--batch 8] [--long 512]
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
from bench.scheduler_burst import claimed_job
from ops.redis_server import free_port, start_redis, stop_redis
from trickle.config.sections import ModelSettings
from trickle.store.job_store import JobStore
from worker.engine.engine import Engine
from worker.engine.scheduler import BatchScheduler, ScheduledJob
from worker.publisher import TokenPublisher

MODEL_KEYS = ("demo", "bench")
VARIANTS = (("wait (inter_threads=1)", 1, 0), ("second batch (inter_threads=2)", 2, 1))


def run_variant(
    model_dir: Path,
    client: redis.Redis,
    inter: int,
    intra: int,
    batch: int,
    long: int,
    delay: float,
    repeats: int,
) -> dict[str, Any]:
    engine = Engine(
        ModelSettings("m", str(model_dir), device="cpu", inter_threads=inter, intra_threads=intra)
    )
    store = JobStore(client, 60, 60)
    publisher = TokenPublisher(store, lambda _: None, lambda _: None)
    scheduler = BatchScheduler(engine, publisher.publish_step, batch, 5.0, engine_threads=inter)

    def job(max_tokens: int) -> ScheduledJob:
        return claimed_job(engine, store, max_tokens)

    ttfts, rates, solo = [], [], []
    try:
        for _ in range(repeats):
            longs = [job(long) for _ in range(batch)]
            started = time.monotonic()
            for scheduled in longs:
                scheduler.submit(scheduled)
            time.sleep(delay)
            newcomer = job(32)
            submitted = time.time()
            scheduler.submit(newcomer)
            for scheduled in [*longs, newcomer]:
                scheduled.ended.wait(600)
            elapsed = time.monotonic() - started
            assert newcomer.first_token_at is not None
            ttfts.append(newcomer.first_token_at - submitted)
            rates.append(batch * long / elapsed)
        alone = job(32)
        submitted = time.time()
        scheduler.submit(alone)
        alone.ended.wait(60)
        assert alone.first_token_at is not None
        solo.append(alone.first_token_at - submitted)
    finally:
        scheduler.close()
        publisher.close()
        engine.close()
    return {
        "newcomer_ttft_p50_s": statistics.median(ttfts),
        "newcomer_ttft_max_s": max(ttfts),
        "idle_ttft_s": solo[0],
        "long_batch_tokens_per_s": statistics.median(rates),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="demo", choices=MODEL_KEYS)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--long", type=int, default=512)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        port = free_port()
        server = start_redis(port, Path(scratch), append_only=False)
        client = redis.Redis(port=port, decode_responses=True)
        try:
            results = {
                name: run_variant(
                    models.prepare(args.model).path,
                    client,
                    inter,
                    intra,
                    args.batch,
                    args.long,
                    args.delay,
                    args.repeats,
                )
                for name, inter, intra in VARIANTS
            }
        finally:
            stop_redis(server)
    print(
        f"| {args.model}: {args.batch} x {args.long} tokens running, a 32-token job arrives "
        f"{args.delay * 1000:.0f} ms later | newcomer TTFT p50 | max | idle TTFT | batch tokens/s |"
    )
    print("|---|--:|--:|--:|--:|")
    for name, r in results.items():
        print(
            f"| {name} | {r['newcomer_ttft_p50_s'] * 1000:.1f} ms | "
            f"{r['newcomer_ttft_max_s'] * 1000:.1f} ms | {r['idle_ttft_s'] * 1000:.1f} ms | "
            f"{r['long_batch_tokens_per_s']:,.0f} |"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
