"""What one publisher flush costs on the fast path: ``JobStore.queue_step`` and its round trip.

    .venv/bin/python -m bench.publish_cost [--batch 1,32] [--steps 1500]

On a private Redis, B claimed jobs each get one token per step, as the worker's publisher thread
sends them: the arguments built in Python, then one pipelined script call (fence, replay log,
output so far, one message per job). Prints the median wall time of a flush and the client's
CPU per flush. Runs the same against older code too (it only uses the store's long-standing
calls), which is how the README's before/after was taken.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

from ops.redis_server import free_port, start_redis, stop_redis
from trickle.events import TokenEvent
from trickle.jobs import Job, new_job_id
from trickle.params import GenerationParams
from trickle.store.job_store import JobStore, StepAppend


def flush_cost(batch: int, steps: int) -> tuple[float, float]:
    """(median microseconds per flush, client CPU microseconds per flush)."""
    port = free_port()
    server = start_redis(port, Path(tempfile.mkdtemp(prefix="trickle-publish-")), False)
    client = redis.Redis(port=port, decode_responses=True)
    try:
        store = JobStore(client, 600, 600)
        jobs = [
            Job(new_job_id(), "demo", "x", GenerationParams(), created_at=time.time())
            for _ in range(batch)
        ]
        store.create_many(jobs)
        fences = {
            job.id: store.leases.claim(job.id, "n", time.time(), 600_000, 3).fence for job in jobs
        }
        times = []
        cpu = time.process_time()
        for index in range(steps):
            appends = [
                StepAppend(job.id, fences[job.id], [TokenEvent(job.id, index, " tok", -0.1234567)])
                for job in jobs
            ]
            started = time.perf_counter()
            # The store's own pipeline where it has one (scripts by digest), else a plain one.
            make = getattr(store, "pipeline", None)
            pipe = make() if make is not None else client.pipeline(transaction=False)
            store.queue_step(pipe, appends)
            pipe.execute()
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e6, (time.process_time() - cpu) / steps * 1e6
    finally:
        client.close()
        stop_redis(server)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,32")
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args(argv)
    for batch in (int(b) for b in args.batch.split(",")):
        median, cpu = flush_cost(batch, args.steps)
        print(f"batch={batch} flush_median_us={median:.0f} client_cpu_us_per_flush={cpu:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
