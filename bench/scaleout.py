"""Scale-out simulation of the token plane: W web processes, simulated workers, one Redis.

    .venv/bin/python -m bench.scaleout [--web 1,2,4,8] [--rate 4000] [--jobs 64]
                                       [--rates 1000,2000,4000,8000] [--seconds 5]

The real code on both sides, in separate processes, over a real Redis: publishers are the
worker's ``TokenPublisher`` and ``JobStore`` (claimed jobs, fenced appends, the replay log), fed
one token per job per step at a deployment-wide rate; each web process runs the real
``TokenHub`` and a ``JobFollower`` per job it reads (subscribe, read the log, follow). Every job
is read by one reader on one web process (round robin), and one more web process, the
bystander, reads a single job that never produces a token: its CPU is what a web process spends
on tokens it has no reader for.

Per run: Redis egress over the window (``INFO``: everything, publishers' replies and the
readers' log reads included) against the bytes actually delivered (what the readers' own jobs
put on the wire), CPU per web process and per delivered token, and the delivery latency from
the publisher's hand-off (the token's timestamp) to the reader. A second table keeps one web
process's readers (and their jobs' rates) fixed while the deployment-wide rate grows with more
jobs read elsewhere: its CPU should stay flat.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.harness.stats import percentile
from ops.redis_server import free_port, start_redis, stop_redis


def _client(url: str, **options: Any) -> Any:
    import redis

    return redis.Redis.from_url(url, decode_responses=True, **options)


def _subscriber(url: str) -> Any:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return _client(url, socket_timeout=None, retry=Retry(NoBackoff(), 0))


def publisher_main(url: str, job_ids: list[str], rate: float, start: Any, seconds: float,
                   results: Any) -> None:  # fmt: skip
    """A simulated worker: claims its jobs, then one token per job per step at ``rate``."""
    from trickle.events import TokenEvent
    from trickle.job_result import JobResult
    from trickle.jobs import FinishReason, JobStatus
    from trickle.store.job_store import JobStore
    from worker.publish_items import TokenItem
    from worker.publisher import TokenPublisher

    store = JobStore(_client(url), 600, 600)
    fences = {
        j: store.leases.claim(j, f"sim{id(job_ids)}", time.time(), 120_000, 3).fence
        for j in job_ids
    }
    publisher = TokenPublisher(store, lambda job_id: None, lambda job_id: None)
    interval = len(job_ids) / rate
    t0 = _await_start(start, results)
    cpu_start = time.process_time()
    index, due = 0, t0
    while time.time() < t0 + seconds:
        now = time.time()
        publisher.publish_step(
            tuple(TokenItem(TokenEvent(j, index, " tok", now), fences[j]) for j in job_ids)
        )
        index += 1
        due += interval
        time.sleep(max(0.0, due - time.time()))
    done = [
        publisher.publish_finish(
            j, fences[j],
            JobResult(JobStatus.SUCCEEDED, " tok" * index, FinishReason.LENGTH, index, time.time()),
        )
        for j in job_ids
    ]  # fmt: skip
    for persisted in done:
        persisted.wait(30)
    publisher.close()
    cpu = time.process_time() - cpu_start
    results.put({"role": "publisher", "tokens": index * len(job_ids), "cpu_seconds": cpu})


def web_main(url: str, job_ids: list[str], start: Any, seconds: float, results: Any) -> None:
    """A web process: the real hub, a follower per job it reads; reports CPU and deliveries."""
    from trickle.events import TokenEvent
    from trickle.store.job_store import JobStore
    from web.streams.follow import Done, JobFollower
    from web.streams.hub import TokenHub

    store = JobStore(_client(url), 600, 600)
    hub = TokenHub(lambda: _subscriber(url))
    wire: dict[str, int] = {}
    dispatch = hub._dispatch

    def tally(*message: str) -> None:  # (channel, data), or (data) on the one global channel
        channel = message[0] if len(message) == 2 else ""
        wire[channel] = wire.get(channel, 0) + _message_bytes(channel, message[-1])
        dispatch(*message)

    if hasattr(hub, "_subscriber"):  # per-job channels: the subscriber calls the hub
        hub._subscriber._on_message = tally
    else:  # one global channel (the design before): the listener calls _dispatch
        hub._dispatch = tally  # type: ignore[method-assign,assignment]
    latencies: list[float] = []
    delivered = [0]
    followers = [JobFollower(store, hub, job_id, -1) for job_id in job_ids]

    def read(follower: JobFollower) -> None:
        for chunk in follower.chunks(keepalive_seconds=5.0):
            arrived = time.time()
            for event in chunk:
                if isinstance(event, TokenEvent):
                    delivered[0] += 1
                    in_window = start.value <= arrived <= start.value + seconds
                    if in_window and event.logprob is not None:
                        latencies.append(arrived - event.logprob)
                elif isinstance(event, Done):
                    return

    threads = [threading.Thread(target=read, args=(f,), daemon=True) for f in followers]
    for thread in threads:
        thread.start()
    t0 = _await_start(start, results)
    cpu, counted = time.process_time(), delivered[0]
    time.sleep(max(0.0, t0 + seconds - time.time()))
    cpu, counted = time.process_time() - cpu, delivered[0] - counted
    for thread in threads:
        thread.join(timeout=30)
    hub.close()
    results.put({
        "role": "web", "jobs": len(job_ids), "cpu_seconds": cpu, "delivered": counted,
        "latencies": latencies, "wire": wire,
    })  # fmt: skip


def _await_start(start: Any, results: Any) -> float:
    """Say this process is ready, then wait for the window's start time (set once all are)."""
    results.put({"role": "ready"})
    while not start.value:
        time.sleep(0.01)
    time.sleep(max(0.0, start.value - time.time()))
    return float(start.value)


def _message_bytes(channel: str, data: str) -> int:
    """A pub/sub message's size on the wire (RESP2: kind, channel, payload)."""
    encoded = data.encode()
    ch = channel.encode()
    return (
        17 + len(f"${len(ch)}\r\n") + len(ch) + 2 + len(f"${len(encoded)}\r\n") + len(encoded) + 2
    )


def run(url: str, client: Any, web: int, rate: float, jobs: int, seconds: float,
        fixed_readers: int = 0) -> dict[str, Any]:  # fmt: skip
    """One configuration. ``fixed_readers``: web process 0 reads that many jobs, the others
    split the rest (the flat-CPU table); 0: every process reads an equal share."""
    from trickle.jobs import Job, new_job_id
    from trickle.params import GenerationParams
    from trickle.store.job_store import JobStore

    store = JobStore(client, 600, 600)
    all_jobs = [Job(new_job_id(), "demo", "x", GenerationParams(), created_at=time.time())
                for _ in range(jobs)]  # fmt: skip
    store.create_many(all_jobs)
    ids = [job.id for job in all_jobs]
    if fixed_readers:
        shares = [ids[:fixed_readers]] + [ids[fixed_readers + i :: web - 1] for i in range(web - 1)]
    else:
        shares = [ids[i::web] for i in range(web)]
    idle = Job(new_job_id(), "demo", "x", GenerationParams(), created_at=time.time())
    store.create(idle)  # the bystander's job: queued, never a token
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    start: Any = ctx.Value("d", 0.0)
    processes = [ctx.Process(target=web_main, args=(url, share, start, seconds, results))
                 for share in [*shares, [idle.id]]]  # fmt: skip
    publishers = 2
    processes += [
        ctx.Process(target=publisher_main, args=(url, ids[i::publishers], rate / publishers, start,
                                                 seconds, results))
        for i in range(publishers)
    ]  # fmt: skip
    for process in processes:
        process.start()
    for _ in processes:
        assert results.get(timeout=120)["role"] == "ready"
    t0 = time.time() + 0.3
    start.value = t0
    time.sleep(max(0.0, t0 - time.time()))
    before, cpu_before = int(client.info("stats")["total_net_output_bytes"]), _redis_cpu(client)
    time.sleep(max(0.0, t0 + seconds - time.time()))
    egress = int(client.info("stats")["total_net_output_bytes"]) - before
    redis_cpu = _redis_cpu(client) - cpu_before
    store.cancel(idle.id, time.time())
    reports = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    row = summarize(reports, web, rate, seconds, egress, shares, fixed_readers)
    row["redis_cpu_us_per_token"] = round(
        redis_cpu / max(row["tokens_per_s"] * seconds, 1) * 1e6, 2
    )
    return row


def _redis_cpu(client: Any) -> float:
    """CPU seconds the Redis server has used (user + system, main thread and all)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def summarize(reports: list[dict[str, Any]], web: int, rate: float, seconds: float, egress: int,
              shares: list[list[str]], fixed_readers: int) -> dict[str, Any]:  # fmt: skip
    webs = [r for r in reports if r["role"] == "web"]
    readers = sorted((r for r in webs if r["jobs"] and r["delivered"]), key=lambda r: -r["jobs"])
    bystander = next(r for r in webs if r["delivered"] == 0 and r["jobs"] == 1)
    published = sum(r["tokens"] for r in reports if r["role"] == "publisher")
    delivered_tokens = sum(r["delivered"] for r in webs)
    read_ids = {j for share in shares for j in share}
    delivered_bytes = 0.0
    for r in webs:
        for channel, size in r["wire"].items():
            if channel and channel.rsplit(":", 1)[-1] in read_ids:
                delivered_bytes += size  # a job's own channel: all of it was wanted
            elif not channel:  # one channel for every job: the share of its tokens read here
                delivered_bytes += size * r["delivered"] / max(published, 1)
    latencies = [x for r in webs for x in r["latencies"]]
    cpu = [r["cpu_seconds"] / seconds * 100 for r in readers]
    row = {
        "web": web,
        "jobs": len(read_ids),
        "tokens_per_s": round(delivered_tokens / seconds),
        "target_rate": rate,
        "egress_per_delivered_byte": round(egress / delivered_bytes, 2)
        if delivered_bytes
        else None,
        "egress_bytes_per_token": round(egress / max(delivered_tokens, 1), 1),
        "cpu_percent_per_web_mean": round(sum(cpu) / len(cpu), 1) if cpu else None,
        "cpu_us_per_delivered_token": round(
            sum(r["cpu_seconds"] for r in readers) / max(delivered_tokens, 1) * 1e6, 1
        ),
        "bystander_cpu_percent": round(bystander["cpu_seconds"] / seconds * 100, 2),
        # The simulated workers' whole process (the step loop and the publisher thread).
        "publisher_cpu_us_per_token": round(
            sum(r["cpu_seconds"] for r in reports if r["role"] == "publisher")
            / max(published, 1)
            * 1e6,
            2,
        ),
        "latency_p50_ms": _ms(percentile(latencies, 50)),
        "latency_p99_ms": _ms(percentile(latencies, 99)),
    }
    if fixed_readers:
        fixed = next((r for r in readers if r["jobs"] == fixed_readers), None)
        row["fixed_process_cpu_percent"] = (
            round(fixed["cpu_seconds"] / seconds * 100, 2) if fixed else None
        )
    return row


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--web", default="1,2,4,8")
    parser.add_argument("--rate", type=float, default=4000)
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--rates", default="1000,2000,4000,8000")
    parser.add_argument("--fixed-readers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trickle-scaleout-") as work:
        port = free_port()
        server = start_redis(port, Path(work), append_only=False)
        url = f"redis://127.0.0.1:{port}/0"
        client = _client(url)
        try:
            by_web = [
                run(url, client, int(w), args.rate, args.jobs, args.seconds)
                for w in args.web.split(",")
            ]
            # The fixed process's own jobs keep their rate; more jobs elsewhere add the rest.
            per_job = args.rate / args.jobs
            by_rate = [
                run(url, client, 4, float(r), round(float(r) / per_job), args.seconds,
                    args.fixed_readers)
                for r in args.rates.split(",")
            ]  # fmt: skip
        finally:
            client.close()
            stop_redis(server)
    print(f"### W web processes, {args.jobs} jobs, each read once, ~{args.rate:.0f} tokens/s\n")
    print(table(by_web, list(by_web[0])))
    print(
        f"\n### one web process reading {args.fixed_readers} jobs (each at {per_job:.0f} tokens/s)"
        " while the deployment-wide rate grows with more jobs elsewhere (W=4)\n"
    )
    print(table(by_rate, ["target_rate", "jobs", "tokens_per_s", "fixed_process_cpu_percent",
                          "bystander_cpu_percent", "egress_per_delivered_byte"]))  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"by_web": by_web, "by_rate": by_rate}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
