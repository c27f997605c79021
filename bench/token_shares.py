"""Shares in tokens, not turns: ``python -m bench.token_shares [--seconds S] [--turns]``.

A real stack (bench.tenants' TenantStack, one worker, the demo model) with two plain keys that
both flood: key A sends long jobs (``--long`` tokens), key B short ones (``--short``). Printed:
the tokens each key was served over the same ``--seconds`` window once both backlogs are
queued, and B's share of them. With ``--turns`` (``tuning.share_lag_tokens = 0``) keys only
take turns by jobs, and A's long jobs take the engine; with the token counters (the default)
each key gets about half (worker/fairness/vtc.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis
import requests

from bench.tenants import KEY_A, KEY_B, TenantStack, submit
from trickle import keys


def flood(base: str, key: str, count: int, max_tokens: int, into: list[str]) -> None:
    with requests.Session() as session:
        into.extend(submit(session, base, key, max_tokens) for _ in range(count))


def served(client: redis.Redis, job_ids: list[str]) -> int:
    """Tokens the jobs' replay logs hold now."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.llen(keys.job_tokens(job_id))
    return sum(int(length) for length in pipe.execute())


def run(seconds: float, long: int, short: int, turns: bool, batch: int) -> dict[str, Any]:
    extra = "[tuning]\nshare_lag_tokens = 0\n" if turns else ""
    model_extra = f"max_batch_size = {batch}\n" if batch else ""
    # Enough of each to stay queued through the window whichever key gets the engine.
    long_jobs, short_jobs = int(seconds * 1000 / long), int(seconds * 1000 / short)
    with tempfile.TemporaryDirectory(prefix="bench-token-shares-") as tmp:
        stack = TenantStack(Path(tmp), 1, plain_keys=True, extra=extra, model_extra=model_extra)
        try:
            jobs_a: list[str] = []
            jobs_b: list[str] = []
            floods = [
                threading.Thread(target=flood, args=(stack.base, KEY_A, long_jobs, long, jobs_a)),
                threading.Thread(target=flood, args=(stack.base, KEY_B, short_jobs, short, jobs_b)),
            ]
            for thread in floods:
                thread.start()
            for thread in floods:
                thread.join()
            start_a, start_b = served(stack.client, jobs_a), served(stack.client, jobs_b)
            time.sleep(seconds)
            a = served(stack.client, jobs_a) - start_a
            b = served(stack.client, jobs_b) - start_b
        finally:
            stack.close()
    return {
        "policy": "turns" if turns else "tokens (VTC)",
        "window_s": seconds,
        "max_batch_size": batch or "default",
        "a_long_jobs": {"max_tokens": long, "queued": long_jobs, "tokens_served": a},
        "b_short_jobs": {"max_tokens": short, "queued": short_jobs, "tokens_served": b},
        "b_share": round(b / max(a + b, 1), 3),
        "tokens_per_s": round((a + b) / seconds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--long", type=int, default=256)
    parser.add_argument("--short", type=int, default=32)
    parser.add_argument("--turns", action="store_true", help="tuning.share_lag_tokens = 0")
    parser.add_argument("--batch", type=int, default=0, help="max_batch_size (0: the default)")
    args = parser.parse_args(argv)
    report = run(args.seconds, args.long, args.short, args.turns, args.batch)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
