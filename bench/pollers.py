"""Redis egress per generated token when nobody streams: jobs awaited by ``Prefer: wait`` pollers.

    .venv/bin/python -m bench.pollers [--jobs 40] [--max-tokens 128] [--model demo]

The real stack (own Redis, one Celery worker, gunicorn). Each of ``--jobs`` clients POSTs a
greedy ``ignore_eos`` job, then GETs it with ``Prefer: wait=30`` until it is finished; no client
opens a stream. Egress is Redis's ``total_net_output_bytes`` over the run (every client: web,
worker, Celery, this script's own INFO calls), divided by the tokens the jobs generated; the
stack reaches Redis through a byte-counting proxy (``bench.harness.redis_meter``), which splits it
by command. Tokens
nobody streams should never leave Redis: what remains is the job objects, the queue and the
worker's own round trips.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.harness import models
from bench.harness.log import progress
from bench.harness.params import RunParams
from bench.harness.stack import HOST, Stack


def poll_one(port: int, body: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """POST a job, then GET it with ``Prefer: wait`` until it has finished."""
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        connection.request(
            "POST", "/v1/jobs", json.dumps(body), {"Content-Type": "application/json"}
        )
        job = json.loads(connection.getresponse().read())
        while job["status"] in ("queued", "running"):
            connection.request("GET", f"/v1/jobs/{job['id']}", headers={"Prefer": "wait=30"})
            job = json.loads(connection.getresponse().read())
        results.append(job)
    finally:
        connection.close()


def run_pollers(port: int, body: dict[str, Any], jobs: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=poll_one, args=(port, body, results)) for _ in range(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def measure(stack: Stack, model: str, jobs: int, max_tokens: int) -> dict[str, Any]:
    assert stack.client is not None
    body = RunParams(temperature=0.0).job_body(model, models.PROMPT, max_tokens)
    # Warm up with the same load: the web tier's connection pool grows to the concurrency it
    # sees once, and a measurement of connection set-ups would not be the steady state.
    run_pollers(stack.web_port, body, jobs)
    time.sleep(0.5)
    before = int(stack.client.info("stats")["total_net_output_bytes"])
    metered = stack.meter.snapshot() if stack.meter is not None else None
    started = time.monotonic()
    results = run_pollers(stack.web_port, body, jobs)
    elapsed = time.monotonic() - started
    after = int(stack.client.info("stats")["total_net_output_bytes"])
    tokens = sum(int(job["usage"]["completion_tokens"]) for job in results)
    egress = after - before
    by_command: dict[str, float] = {}
    if stack.meter is not None and metered is not None and tokens:
        spent = stack.meter.snapshot()
        spent.subtract(metered)
        by_command = {
            name: round(size / tokens, 2) for name, size in spent.most_common() if size > 0
        }
    return {
        "jobs": len(results),
        "succeeded": sum(job["status"] == "succeeded" for job in results),
        "max_tokens": max_tokens,
        "tokens": tokens,
        "seconds": round(elapsed, 2),
        "redis_egress_bytes": egress,
        "egress_bytes_per_token": round(egress / tokens, 1) if tokens else None,
        # From the meter (the stack's own traffic, not this script's INFO calls), per token.
        "egress_bytes_per_token_by_command": by_command,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--model", default="demo")
    args = parser.parse_args(argv)
    model = models.prepare(args.model)
    with tempfile.TemporaryDirectory(prefix="trickle-pollers-") as work:
        stack = Stack(Path(work), model, RunParams(), args.max_tokens, metered=True)
        try:
            stack.start()
            stack.start_worker(model.key)
            result = measure(stack, model.key, args.jobs, args.max_tokens)
        finally:
            stack.close()
    progress(json.dumps(result))
    print(json.dumps(result, indent=2))
    return 0 if result["succeeded"] == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
