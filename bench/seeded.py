"""What a seed costs: seeded against unseeded sampled jobs of the same length, on the stack.

    .venv/bin/python -m bench.seeded                       # demo + bench models, ~1 minute
    .venv/bin/python -m bench.seeded --models demo --runs 30 --tokens 256

Per model, one stack (embedded Redis, gunicorn, one Celery worker) and ``--runs`` pairs of
``Prefer: wait`` jobs on one keep-alive session, one after another: an unseeded job, then the
same job with a seed (a new seed each time), each ``--tokens`` long (``ignore_eos``). A pair
sees the same machine, so the median of the pairs' ratios is the figure (issue 43 asks for
seeded <= 1.5x unseeded at 256 tokens); each kind's POST → answer p50 and p90 are printed too.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from bench.harness.log import progress
from bench.harness.models import PROMPT, prepare
from bench.harness.params import RunParams
from bench.harness.stack import HOST, Stack
from bench.harness.stats import percentile


def timed(session: requests.Session, url: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    response = session.post(url, json=body, headers={"Prefer": "wait=120"}, timeout=180)
    took = time.perf_counter() - started
    job = response.json()
    if job.get("status") != "succeeded" or job["usage"]["completion_tokens"] != body["max_tokens"]:
        raise RuntimeError(f"job did not run to its length: {job}")
    return took


def measure(key: str, tokens: int, runs: int) -> dict[str, float | None]:
    model = prepare(key)
    params = RunParams(max_tokens=tokens, temperature=1.0)
    with tempfile.TemporaryDirectory(prefix="bench-seeded-") as work:
        stack = Stack(Path(work), model, params, ceiling=tokens)
        try:
            stack.start()
            stack.start_worker(model.key)
            url = f"http://{HOST}:{stack.web_port}/v1/jobs"
            body = params.job_body(model.key, PROMPT)
            plain: list[float] = []
            seeded: list[float] = []
            with requests.Session() as session:
                timed(session, url, body)  # warm-up: each path's first call allocates
                timed(session, url, {**body, "seed": 0})
                for run in range(runs):
                    plain.append(timed(session, url, body))
                    seeded.append(timed(session, url, {**body, "seed": run + 1}))
        finally:
            stack.close()
    ratios = [s / p for s, p in zip(seeded, plain, strict=True)]
    return {
        "unseeded_p50_ms": 1000 * (percentile(plain, 50) or 0),
        "unseeded_p90_ms": 1000 * (percentile(plain, 90) or 0),
        "seeded_p50_ms": 1000 * (percentile(seeded, 50) or 0),
        "seeded_p90_ms": 1000 * (percentile(seeded, 90) or 0),
        "ratio_p50": percentile(ratios, 50),
        "ratio_p90": percentile(ratios, 90),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.seeded", description=__doc__)
    parser.add_argument("--models", default="demo,bench")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    rows = {}
    for key in args.models.split(","):
        progress(f"{key}: {args.runs} pairs of {args.tokens}-token jobs")
        rows[key] = measure(key, args.tokens, args.runs)
    print(f"\n{args.tokens}-token sampled jobs, POST -> answer (Prefer: wait), {args.runs} pairs")
    print("| model | unseeded p50 / p90 ms | seeded p50 / p90 ms | seeded/unseeded p50 / p90 |")
    print("|---|---|---|---|")
    for key, row in rows.items():
        print(
            f"| {key} | {row['unseeded_p50_ms']:.1f} / {row['unseeded_p90_ms']:.1f} "
            f"| {row['seeded_p50_ms']:.1f} / {row['seeded_p90_ms']:.1f} "
            f"| {row['ratio_p50']:.2f}x / {row['ratio_p90']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
