"""Chaos under load, measured from outside: issue 44's goal as one command.

    .venv/bin/python -m bench.chaos [--seconds 90] [--runs 5] [--appendfsync everysec|always]
                                    [--busy]

Each run starts its own stack (``bench.harness.chaos_stack``: Redis with an append-only file
fsynced as ``--appendfsync`` says, gunicorn, two Celery workers) and sends open-loop traffic
(``bench.chaos_clients``): about 4 streamed jobs/s followed over SSE and resumed with
``Last-Event-ID`` after any error, plus 1 polled job/s, every POST with an ``Idempotency-Key``
and retried until answered. Seven SIGKILLs are spread over the run, each part restarted as a
supervisor would: a worker x3 (the two in turn), gunicorn x2, Redis x2 (restarted from its AOF).

Then, once every job ended, per run: ``lost`` (an accepted job that never reached a final state
or vanished), ``failed`` (final but not succeeded), ``inexact`` (a stream whose indexes are not
0..n-1 once each or whose text is not the stored output, live or in a fresh replay from the
first token) and ``duplicates`` (a key whose answers named two jobs, or a job record in Redis
that no answer named: a retried POST made it). Exits 1 unless every run has all four at 0.

``--busy`` holds one CPU busy for the whole of every run (a spinning process pinned to the
machine's last core), so the stack meets its kills on a saturated machine, as a shared host
gives it: slow steps, late lease renewals, resumed jobs that crawl.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from bench.chaos_clients import Stream, Traffic, poll, post_job, replay
from bench.harness import models
from bench.harness.chaos_stack import ChaosStack
from bench.harness.log import progress
from trickle.config.settings import PROJECT_ROOT

STREAMS_PER_S = 4.0
POLLED_PER_S = 1.0
REDIS_DOWN_SECONDS = 1.0
JOB_KEY = re.compile(r":job:(job_[0-9a-f]{32})$")


@dataclass
class RunFigures:
    jobs: int = 0
    streams: int = 0
    resumes: int = 0
    kills: int = 0
    cut: int = 0  # streams mid-job at each kill, summed over the kills
    lost: int = 0
    failed: int = 0
    inexact: int = 0
    duplicates: int = 0
    refused: int = 0  # a POST answered with a 4xx no retry fixes, or never answered
    tokens: int = 0

    @property
    def passed(self) -> bool:
        return not (self.lost or self.failed or self.inexact or self.duplicates or self.refused)


def kill_plan(stack: ChaosStack) -> list[tuple[str, Callable[[], None]]]:
    """Worker, Redis, web, worker, Redis, web, worker: each kind meets the others' aftermath."""
    first, second = stack.worker_names[0], stack.worker_names[-1]
    return [
        (f"worker {first}", lambda: stack.kill_worker(first)),
        ("redis", lambda: stack.kill_redis(REDIS_DOWN_SECONDS)),
        ("web", stack.kill_web),
        (f"worker {second}", lambda: stack.kill_worker(second)),
        ("redis", lambda: stack.kill_redis(REDIS_DOWN_SECONDS)),
        ("web", stack.kill_web),
        (f"worker {first}", lambda: stack.kill_worker(first)),
    ]


def run_kills(stack: ChaosStack, traffic: Traffic, seconds: float, figures: RunFigures) -> None:
    """The plan's kills at even intervals inside the traffic's ``seconds``. Counts the streams
    mid-job (tokens received, no ``done`` yet) at each kill, which says the kills hit jobs
    mid-way: a web or Redis kill cuts all of them, a worker kill those of its own jobs."""
    plan = kill_plan(stack)
    start = time.monotonic()
    for index, (what, kill) in enumerate(plan):
        time.sleep(max(0.0, start + seconds * (index + 1) / (len(plan) + 1) - time.monotonic()))
        cut = sum(1 for s in list(traffic.streams) if s.indexes and s.done is None)
        progress(f"kill {index + 1}/{len(plan)}: {what}, {cut} streams mid-job")
        kill()
        figures.kills += 1
        figures.cut += cut


def stream_exact(stream: Stream, job: dict[str, Any]) -> str:
    """Why ``stream`` is not exactly the stored job ("" when it is)."""
    tokens = int(job["usage"]["completion_tokens"])
    if stream.done is None:
        return "no done"
    if stream.indexes != list(range(tokens)):
        return f"indexes {len(stream.indexes)} of {tokens} (distinct {len(set(stream.indexes))})"
    if stream.text != job["output"]:
        return f"text {len(stream.text)} chars, stored {len(job['output'])}"
    return ""


def job_records(stack: ChaosStack) -> set[str]:
    with redis.Redis.from_url(stack.redis_url, decode_responses=True) as client:
        found = (JOB_KEY.search(key) for key in client.scan_iter("*:job:job_*", count=1000))
        return {match.group(1) for match in found if match}


def check(stack: ChaosStack, traffic: Traffic, body: dict[str, Any], figures: RunFigures) -> None:
    """Every accepted job final; every stream exact live and replayed; one job per key."""
    base = stack.base
    stored: dict[str, dict[str, Any]] = {}
    answered = {job_id for ids in traffic.ledger.ids_by_key.values() for job_id in ids}
    for job_id in sorted(answered):
        job = poll(base, job_id)
        if job is None:
            figures.lost += 1
            progress(f"LOST {job_id}")
            continue
        stored[job_id] = job
        if job["status"] != "succeeded":
            figures.failed += 1
            progress(f"FAILED {job_id}: {job['status']} {job.get('error')}")
        figures.tokens += int(job["usage"]["completion_tokens"])
    for stream in traffic.streams:
        job = stored.get(stream.job_id)
        if job is None:
            continue
        why = stream_exact(stream, job) or stream_exact(replay(base, stream.job_id), job)
        if why:
            figures.inexact += 1
            progress(f"INEXACT {stream.job_id} ({stream.resumes} resumes): {why}")
    for key, ids in traffic.ledger.ids_by_key.items():
        post_job(base, body, key, traffic.ledger)  # a late retry: the ledger notes its job
        if len(ids) > 1:
            figures.duplicates += 1
            progress(f"DUPLICATE {key}: {sorted(ids)}")
    records = job_records(stack)
    progress(f"{len(records)} job records in Redis for {len(answered)} jobs answered")
    orphans = records - answered
    for job_id in sorted(orphans):
        progress(f"DUPLICATE job record no answer named: {job_id}")
    figures.duplicates += len(orphans)
    figures.refused = len(traffic.ledger.refused)


@contextlib.contextmanager
def cpu_hog(busy: bool) -> Iterator[None]:
    """While open, a process spinning on the machine's last CPU (when ``busy``)."""
    if not busy:
        yield
        return
    core = max(os.sched_getaffinity(0))
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"]
    )
    progress(f"CPU hog pid {hog.pid} spinning on core {core}")
    try:
        yield
    finally:
        hog.kill()
        hog.wait(10)


def one_run(args: argparse.Namespace, model: models.PreparedModel, index: int) -> RunFigures:
    work = Path(tempfile.mkdtemp(prefix=f"chaos-{args.appendfsync}-{index}-", dir=args.out))
    stack = ChaosStack(work, model, args.appendfsync, ceiling=args.tokens, workers=2)
    body = {"prompt": models.PROMPT, "max_tokens": args.tokens, "ignore_eos": True}
    figures = RunFigures()
    try:
        stack.start()
        progress(f"run {index + 1}: stack up ({work}); {args.seconds:.0f} s of traffic")
        traffic = Traffic(stack.base, body)
        killer = threading.Thread(target=run_kills, args=(stack, traffic, args.seconds, figures))
        killer.start()
        traffic.run(args.seconds, STREAMS_PER_S, POLLED_PER_S)
        killer.join()
        progress("traffic sent; waiting for every job")
        traffic.join()
        figures.jobs = len({i for ids in traffic.ledger.ids_by_key.values() for i in ids})
        figures.streams = len(traffic.streams)
        figures.resumes = sum(stream.resumes for stream in traffic.streams)
        check(stack, traffic, body, figures)
        for refusal in traffic.ledger.refused:
            progress(f"REFUSED {refusal}")
    finally:
        stack.close()
    return figures


COLUMNS = (
    "jobs", "streams", "resumes", "kills", "cut", "lost", "failed", "inexact", "duplicates",
    "refused", "tokens",
)  # fmt: skip


def table(rows: list[RunFigures], appendfsync: str) -> str:
    lines = [
        f"appendfsync {appendfsync}",
        "| run | " + " | ".join(COLUMNS) + " | result |",
        "|---" * (len(COLUMNS) + 2) + "|",
    ]
    for number, row in enumerate(rows, 1):
        values = asdict(row)
        cells = [str(values[name]) for name in COLUMNS]
        result = "pass" if row.passed else "FAIL"
        lines.append(f"| {number} | " + " | ".join(cells) + f" | {result} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--appendfsync", choices=("everysec", "always"), default="everysec")
    parser.add_argument("--model", default="demo", choices=sorted(models.CHOICES))
    parser.add_argument("--tokens", type=int, default=256, help="max_tokens of every job")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    parser.add_argument("--busy", action="store_true", help="one CPU spinning beside the stack")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = models.prepare(args.model)
    rows: list[RunFigures] = []
    for index in range(args.runs):
        with cpu_hog(args.busy):
            rows.append(one_run(args, model, index))
        print(table(rows, args.appendfsync + (", one CPU busy" if args.busy else "")), flush=True)
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
