"""What one request costs the stack: CPU per process, Redis commands, and a burst's claim latency.

    .venv/bin/python -m bench.request_cost [--model demo] [--jobs 200] [--monitor-jobs 20]

Starts the stack as ``bench.burst_cost`` does (embedded Redis, gunicorn, one Celery worker) and,
over one keep-alive connection, runs ``--jobs`` sequential one-token jobs twice: streamed (POST,
then the SSE stream to ``done``) and ``Prefer: wait``. Each process group's CPU (user + system,
from ``/proc``; the engine is the worker's child, reported apart) is divided by the jobs. Then a
``MONITOR`` connection names every Redis command ``--monitor-jobs`` streamed jobs cost (the
stack's idle commands over the same time, heartbeats and sweeps, measured first and taken off):
those the clients sent, and apart (``lua:``) those the job store's scripts ran inside Redis.
Then 16 jobs are POSTed at once, ``--bursts`` times, and each job record's own ``created_at`` ->
``started_at`` is reported, with every process's time on a CPU and time runnable but waiting
for one (the kernel's per-thread ``schedstat``) from the release until the last claim: whether
a burst waits for its own work or for cores that are full. Last, the web tier alone: CPU per
``POST /v1/jobs`` in this process (Flask's test client, median of five rounds), the steadiest
figure on a shared machine.
Absolute figures drift on a shared machine: compare runs back to back.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.harness import models
from bench.harness.log import progress
from bench.harness.params import RunParams
from bench.harness.profiling import profiled
from bench.harness.stack import HOST, Stack, cpu_of, process_groups, schedstat_of, schedstat_paths
from trickle import keys
from trickle.config.settings import PROJECT_ROOT

PROMPT = "Once upon a time"


def post_job(
    conn: http.client.HTTPConnection, model: str, wait: bool, max_tokens: int = 1
) -> dict[str, Any]:
    fields: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens}
    if max_tokens > 1:
        fields["ignore_eos"] = True
    body = json.dumps(fields)
    headers = {"Content-Type": "application/json"}
    if wait:
        headers["Prefer"] = "wait=30"
    conn.request("POST", "/v1/jobs", body, headers)
    response = conn.getresponse()
    job: dict[str, Any] = json.loads(response.read())
    if response.status >= 300 and "id" not in job:
        raise RuntimeError(f"POST /v1/jobs answered {response.status}: {job}")
    return job


def follow_stream(conn: http.client.HTTPConnection, job: dict[str, Any]) -> int:
    """The job's stream, read to its end; the token events it carried."""
    url = job["urls"]["stream"]
    conn.request("GET", url[url.index("/v1/") :], headers={"Accept": "text/event-stream"})
    response = conn.getresponse()
    body = response.read()  # the stream ends after its done event
    if b"event: done" not in body:
        raise RuntimeError(f"stream of {job['id']} ended without done: {body[-200:]!r}")
    return body.count(b"event: token")


def one_job(conn: http.client.HTTPConnection, model: str, mode: str) -> None:
    job = post_job(conn, model, wait=mode == "wait")
    if mode == "streamed":
        follow_stream(conn, job)


def cpu_per_job(
    stack: Stack, model: str, mode: str, jobs: int, profile_dir: Path | None = None
) -> tuple[dict[str, float], float]:
    """Per process group, ms of CPU per job; and the wall seconds the jobs took."""
    groups = process_groups(stack, model)
    conn = http.client.HTTPConnection(HOST, stack.web_port, timeout=60)
    for _ in range(10):  # warm the connection, the worker's threads and the web's caches
        one_job(conn, model, mode)
    with profiled(groups, profile_dir):
        before, start = cpu_of(groups), time.monotonic()
        for _ in range(jobs):
            one_job(conn, model, mode)
        wall = time.monotonic() - start
        after = cpu_of(groups)
    conn.close()
    per_job = {name: round(1e3 * (after[name] - before[name]) / jobs, 3) for name in groups}
    return per_job, wall


def monitored(url: str, seconds: float | None, action: Any = None) -> tuple[Counter[str], float]:
    """Commands Redis ran while ``action`` ran (or for ``seconds``), and the time taken."""
    client = redis.Redis.from_url(url)
    counts: Counter[str] = Counter()
    stop = threading.Event()
    started = threading.Event()

    def run() -> None:
        with client.monitor() as monitor:  # type: ignore[no-untyped-call]
            started.set()
            for line in monitor.listen():
                if stop.is_set():
                    return
                command = str(line.get("command", "")).split(" ", 1)[0].upper()
                # A command a Lua script runs inside Redis is no round trip: marked apart.
                inside = line.get("client_address") == "lua"
                counts[f"lua:{command}" if inside else command] += 1

    thread = threading.Thread(target=run, name="bench-monitor", daemon=True)
    thread.start()
    started.wait(5)
    time.sleep(0.2)
    counts.clear()
    start = time.monotonic()
    if action is not None:
        action()
    else:
        time.sleep(seconds or 0)
    wall = time.monotonic() - start
    snapshot = Counter(counts)
    stop.set()
    redis.Redis.from_url(url).ping()  # one more command wakes the monitor thread
    thread.join(5)
    return snapshot, wall


def commands_per_job(stack: Stack, model: str, jobs: int) -> dict[str, Any]:
    """Every command ``jobs`` streamed one-token jobs cost, less the idle rate over that time."""
    idle, idle_wall = monitored(stack.redis_url, 3.0)
    conn = http.client.HTTPConnection(HOST, stack.web_port, timeout=60)
    one_job(conn, model, "streamed")

    def run() -> None:
        for _ in range(jobs):
            one_job(conn, model, "streamed")

    busy, wall = monitored(stack.redis_url, None, run)
    conn.close()
    per_job: dict[str, float] = {}
    for command in set(busy) | set(idle):
        value = (busy[command] - idle[command] * wall / idle_wall) / jobs
        if value >= 0.05:
            per_job[command] = round(value, 2)
    ordered = dict(sorted(per_job.items(), key=lambda item: -item[1]))
    sent = {name: n for name, n in ordered.items() if not name.startswith("lua:")}
    return {
        "total": round(sum(ordered.values()), 1),
        "sent_by_clients": round(sum(sent.values()), 1),
        "run_inside_scripts": round(sum(ordered.values()) - sum(sent.values()), 1),
        "by_command": ordered,
    }


@dataclass
class Burst:
    """One burst: each job's created -> started (ms), the window from the POSTs' release to
    the last claim seen (ms), and each group's (on-CPU, runnable-but-waiting) ms over it."""

    latencies: list[float]
    window_ms: float
    cpu_ms: dict[str, tuple[float, float]]
    # Each job's release of the POSTs -> started (ms): the client's view, which counts the wait
    # in the web tier before a record is stamped (created -> started does not).
    since_release: list[float] = field(default_factory=list)


def burst_claims(stack: Stack, model: str, size: int, groups: dict[str, list[int]]) -> Burst:
    """POST ``size`` jobs at once (connections opened first) and watch them until every one is
    claimed, reading every process's scheduler statistics before the release and after."""
    conns = [http.client.HTTPConnection(HOST, stack.web_port, timeout=60) for _ in range(size)]
    for conn in conns:
        conn.connect()
    barrier = threading.Barrier(size + 1)
    ids: list[str] = []
    lock = threading.Lock()

    def send(conn: http.client.HTTPConnection) -> None:
        barrier.wait()
        job = post_job(conn, model, wait=False)
        with lock:
            ids.append(job["id"])

    threads = [threading.Thread(target=send, args=(conn,)) for conn in conns]
    for thread in threads:
        thread.start()
    paths = schedstat_paths(groups)
    before = schedstat_of(paths)
    released, released_at = time.monotonic(), time.time()
    barrier.wait()
    for thread in threads:
        thread.join()
    assert stack.client is not None
    stamps: dict[str, tuple[float, float]] = {}
    deadline = time.monotonic() + 30
    while len(stamps) < len(ids) and time.monotonic() < deadline:
        pending = [job_id for job_id in ids if job_id not in stamps]
        pipe = stack.client.pipeline(transaction=False)
        for job_id in pending:
            pipe.hmget(keys.job(job_id), ["created_at", "started_at"])
        for job_id, (created, started) in zip(pending, pipe.execute(), strict=True):
            if created and started:
                stamps[job_id] = (float(created), float(started))
        time.sleep(0.002)  # the poll's own cost shows in the client's and Redis's rows
    after = schedstat_of(paths)
    window = time.monotonic() - released
    for conn in conns:
        conn.close()
    cpu = {
        name: (1e3 * (after[name][0] - before[name][0]), 1e3 * (after[name][1] - before[name][1]))
        for name in groups
    }
    latencies = sorted(1e3 * (started - created) for created, started in stamps.values())
    since_release = sorted(1e3 * (started - released_at) for _, started in stamps.values())
    return Burst(latencies, 1e3 * window, cpu, since_release)


def command_time_per_job(stack: Stack, model: str, jobs: int) -> dict[str, float]:
    """µs Redis spent executing each command (``INFO commandstats``) per streamed one-token
    job, most first; a script's time includes the commands it called (listed too), and the
    rest of Redis's CPU (reading, writing, pub/sub delivery) is in no command."""
    assert stack.client is not None
    conn = http.client.HTTPConnection(HOST, stack.web_port, timeout=60)
    for _ in range(10):
        one_job(conn, model, "streamed")
    stack.client.config_resetstat()
    for _ in range(jobs):
        one_job(conn, model, "streamed")
    stats = stack.client.info("commandstats")
    conn.close()
    spent = {
        name.removeprefix("cmdstat_"): float(row["usec"]) / jobs for name, row in stats.items()
    }
    spent.pop("config", None)
    top = sorted(spent.items(), key=lambda item: -item[1])
    return {name: round(us, 1) for name, us in top}  # no sum: scripts hold their commands


def burst_summary(bursts: list[Burst]) -> dict[str, Any]:
    """Per burst p50 / max created -> started; over the bursts after the first (cold), the
    median window and each group's median on-CPU and run-queue wait within it."""
    warm = bursts[1:] or bursts
    cpu = {
        name: {
            "on_cpu": round(statistics.median(b.cpu_ms[name][0] for b in warm), 1),
            "waiting": round(statistics.median(b.cpu_ms[name][1] for b in warm), 1),
        }
        for name in warm[0].cpu_ms
    }
    return {
        "created_to_started_ms": [
            {"p50": round(statistics.median(b.latencies), 1), "max": round(max(b.latencies), 1)}
            for b in bursts
            if b.latencies
        ],
        "released_to_started_ms": [
            {
                "p50": round(statistics.median(b.since_release), 1),
                "max": round(max(b.since_release), 1),
            }
            for b in bursts
            if b.since_release
        ],
        "window_ms": round(statistics.median(b.window_ms for b in warm), 1),
        "cores": os.cpu_count(),
        "cpu_ms_in_window": cpu,
    }


def post_cpu_in_process(stack: Stack, model: str, jobs: int) -> float:
    """µs of this process's CPU per ``POST /v1/jobs`` through Flask's test client against the
    stack's Redis and worker: the web tier's own work for a submission (validation, record,
    task), without gunicorn, the HTTP client, or the other processes sharing the cores."""
    os.environ["TRICKLE_CONFIG"] = str(stack.config_path)
    from web import create_app  # here: it reads the stack's configuration once

    client = create_app().test_client()
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1}
    for _ in range(50):
        client.post("/v1/jobs", json=body)
    rounds = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(jobs):
            client.post("/v1/jobs", json=body)
        rounds.append(1e6 * (time.process_time() - start) / jobs)
    return round(statistics.median(rounds), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.request_cost", description=__doc__)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--monitor-jobs", type=int, default=20)
    parser.add_argument("--bursts", type=int, default=5)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the stack")
    parser.add_argument("--profile-dir", type=Path, default=None, help="py-spy the web, worker")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = models.prepare(args.model)
    stack = Stack(args.out / f"work-request-cost-{args.model}", model, RunParams(), 64)
    stack.extra_env = dict(item.split("=", 1) for item in args.env)
    result: dict[str, Any] = {"model": args.model, "jobs": args.jobs}
    try:
        stack.start()
        stack.start_worker(args.model)
        for mode in ("streamed", "wait"):
            profile = None if args.profile_dir is None else args.profile_dir / mode
            per_job, wall = cpu_per_job(stack, args.model, mode, args.jobs, profile)
            result[f"cpu_ms_per_job_{mode}"] = per_job
            result[f"jobs_per_s_{mode}"] = round(args.jobs / wall, 1)
            progress(f"{mode}: CPU ms per job {per_job}, {args.jobs / wall:.0f} jobs/s")
        result["redis_commands_per_job"] = commands_per_job(stack, args.model, args.monitor_jobs)
        progress(f"Redis commands per job: {result['redis_commands_per_job']}")
        result["redis_usec_per_job"] = command_time_per_job(stack, args.model, args.jobs)
        progress(f"Redis's own time in each command, us per job: {result['redis_usec_per_job']}")
        groups = process_groups(stack, args.model)
        bursts = []
        for _ in range(args.bursts):
            time.sleep(0.5)  # each burst finds the stack idle
            bursts.append(burst_claims(stack, args.model, 16, groups))
        result["burst16"] = burst_summary(bursts)
        progress(f"16-job bursts: {result['burst16']}")
        result["web_post_us_in_process"] = post_cpu_in_process(stack, args.model, args.jobs)
        progress(f"web alone, in process: {result['web_post_us_in_process']} us CPU per POST")
    finally:
        stack.close()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"request-cost-{args.model}-{stamp}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
