"""What a streamed one-token job costs Trickle against the plainest Flask + Celery service.

    .venv/bin/python -m bench.floor [--model demo] [--jobs 400] [--rounds 3]
        [--tokens 1] [--token-gap-ms 0]

Three services on this machine, one embedded Redis each, measured in turns within each round
so that the machine's drift touches all three alike:

- ``bare``: gunicorn (gevent) and Flask answering the POST and the stream at once (``floor_app``
  with ``FLOOR_MODE=bare``): the web framework's share of two requests;
- ``stock``: ``floor_app``, the least a Flask + Celery service does per streamed job (a record,
  ``send_task``, a stock Celery worker, one shared pub/sub connection), no engine;
- ``trickle``: the stack ``make up`` starts (as ``bench.request_cost`` does), on ``--model``.

Each runs ``--jobs`` sequential one-token jobs over one keep-alive connection: POST, then the
SSE stream to its end; then as many ``Prefer: wait`` jobs (one POST that answers with the
result; ``<service>_wait`` in the output). Printed per service: CPU per job by process
(``/proc``), and p50 of the POST and of POST -> the stream's end as the client sees them.
Trickle's engine process is reported apart; its POST -> end includes a one-token generation.

``--tokens N`` (> 1): the floor of the token path too. Each job streams N tokens: the stock
task publishes each as its own message (``--token-gap-ms`` apart, a decoding step's time), as
a generation loop would, and its stream relays each as an event; Trickle's jobs are
``max_tokens`` N with ``ignore_eos``, and its publisher paces them into messages as it does.
Printed beside the per-job figures: µs of CPU per token by process, and the token events a
stream carried (whether every token arrived: the stock relay subscribes after the POST and
keeps no log, so it can miss the first; it writes an event per message, Trickle's native
stream an event per token however many a message carried). No bare service then (it answers
one token).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.harness import models
from bench.harness.log import progress
from bench.harness.params import RunParams
from bench.harness.stack import HOST, Stack, child_pids, cpu_of, process_groups
from bench.request_cost import PROMPT, follow_stream, post_job
from ops.redis_server import free_port, start_redis, stop_redis
from ops.stack import BIN
from trickle.config.settings import PROJECT_ROOT

Groups = dict[str, list[int]]


class FloorService:
    """``bench.floor_app`` on its own Redis: gunicorn's gevent worker and a stock Celery worker."""

    def __init__(self, mode: str, work: Path, tokens: int = 1, gap_ms: float = 0.0):
        self.mode = mode
        self.tokens, self.gap_ms = tokens, gap_ms  # per job (``--tokens``, ``--token-gap-ms``)
        self.redis_port, self.web_port = free_port(), free_port()
        self.redis = start_redis(self.redis_port, work / f"redis-{mode}", append_only=False)
        env = dict(
            os.environ,
            FLOOR_REDIS_URL=f"redis://{HOST}:{self.redis_port}/0",
            FLOOR_MODE=mode,
            PYTHONPATH=str(PROJECT_ROOT),
        )
        logs = (work / f"{mode}.log").open("ab")
        self.web = subprocess.Popen(
            [str(BIN / "gunicorn"), "-k", "gevent", "-w", "1", "--worker-connections", "1000",
             "--keep-alive", "5", "-b", f"{HOST}:{self.web_port}", "bench.floor_app:app"],
            env=env, cwd=PROJECT_ROOT, stdout=logs, stderr=logs,
        )  # fmt: skip
        self.worker = None
        if mode != "bare":
            self.worker = subprocess.Popen(
                [str(BIN / "celery"), "-A", "bench.floor_app:celery", "worker", "-P", "threads",
                 "-c", "8", "--without-gossip", "--without-mingle", "--without-heartbeat",
                 "-l", "warning"],
                env=env, cwd=PROJECT_ROOT, stdout=logs, stderr=logs,
            )  # fmt: skip

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection(HOST, self.web_port, timeout=5)
            try:
                self.stream(conn, self.post(conn))
                return
            except (OSError, http.client.HTTPException, RuntimeError):
                time.sleep(0.3)
            finally:
                conn.close()
        raise RuntimeError(f"floor service {self.mode} did not answer")

    def groups(self) -> Groups:
        groups = {"web": child_pids(self.web.pid), "redis": [self.redis.pid]}
        if self.worker is not None:
            groups["worker"] = [self.worker.pid, *child_pids(self.worker.pid)]
        return groups

    def post(self, conn: http.client.HTTPConnection, wait: bool = False) -> str:
        """A job's POST (with ``wait``, answered with its result); its id."""
        fields = {"prompt": PROMPT, "max_tokens": self.tokens, "token_gap_ms": self.gap_ms}
        body = json.dumps({"model": "demo", **fields})
        headers = {"Content-Type": "application/json"}
        if wait:
            headers["Prefer"] = "wait=30"
        conn.request("POST", "/v1/jobs", body, headers)
        answer = json.loads(conn.getresponse().read())
        if wait and answer.get("status") != "succeeded":
            raise RuntimeError(f"floor wait answered {answer}")
        return str(answer["id"])

    @staticmethod
    def stream(conn: http.client.HTTPConnection, job_id: str) -> int:
        """The job's stream, read to its end; the token events it carried."""
        conn.request("GET", f"/v1/jobs/{job_id}/stream")
        body = conn.getresponse().read()
        if b"event: done" not in body:
            raise RuntimeError("floor stream ended without done")
        return body.count(b"event: token")

    def close(self) -> None:
        for process in (self.web, self.worker):
            if process is not None:
                process.terminate()
                process.wait(timeout=15)
        stop_redis(self.redis)


def timed_jobs(
    post: Callable[[], Any],
    stream: Callable[[Any], int | None],
    groups: Groups,
    jobs: int,
    tokens: int = 1,
) -> dict[str, Any]:
    """``jobs`` sequential jobs: CPU ms per job by process group, and the client's p50s; with
    ``tokens`` > 1 also µs per token and the token events a stream carried."""
    for _ in range(10):
        stream(post())
    posts, ends, events = [], [], 0
    before = cpu_of(groups)
    for _ in range(jobs):
        start = time.perf_counter()
        job = post()
        posts.append(time.perf_counter() - start)
        events += stream(job) or 0
        ends.append(time.perf_counter() - start)
    after = cpu_of(groups)
    result: dict[str, Any] = {
        f"{name}_ms": round(1e3 * (after[name] - before[name]) / jobs, 3) for name in groups
    }
    if tokens > 1:
        for name in groups:
            spent = after[name] - before[name]
            result[f"{name}_us_per_token"] = round(1e6 * spent / jobs / tokens, 1)
        result["token_events_per_stream"] = round(events / jobs, 1)
    result["post_p50_ms"] = round(1e3 * statistics.median(posts), 2)
    result["post_to_end_p50_ms"] = round(1e3 * statistics.median(ends), 2)
    return result


def no_stream(_job: Any) -> None:
    """A ``Prefer: wait`` job's POST already carried its result."""


def measure_floor(service: FloorService, jobs: int, wait: bool) -> dict[str, Any]:
    conn = http.client.HTTPConnection(HOST, service.web_port, timeout=60)
    try:
        post = partial(service.post, conn, wait)
        stream = no_stream if wait else partial(service.stream, conn)
        return timed_jobs(post, stream, service.groups(), jobs, service.tokens)
    finally:
        conn.close()


def measure_trickle(
    stack: Stack, model: str, jobs: int, wait: bool, tokens: int = 1
) -> dict[str, Any]:
    conn = http.client.HTTPConnection(HOST, stack.web_port, timeout=60)
    groups = process_groups(stack, model)
    del groups["client"]

    def post() -> dict[str, Any]:
        job = post_job(conn, model, wait=wait, max_tokens=tokens)
        if wait and job.get("status") != "succeeded":
            raise RuntimeError(f"Prefer: wait answered {job.get('status')}")
        return job

    try:
        stream = no_stream if wait else partial(follow_stream, conn)
        return timed_jobs(post, stream, groups, jobs, tokens)
    finally:
        conn.close()


def summary(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per service, the median over rounds of each figure."""
    out: dict[str, dict[str, float]] = {}
    for service in rounds[0]:
        figures = rounds[0][service].keys()
        out[service] = {
            name: round(statistics.median(r[service][name] for r in rounds), 3) for name in figures
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--tokens", type=int, default=1, help="per job (> 1: no bare service; per-token figures)"
    )
    parser.add_argument(
        "--token-gap-ms", type=float, default=0.0, help="the stock task's pause between tokens"
    )
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = models.prepare(args.model)
    work = Path(tempfile.mkdtemp(prefix="floor-", dir=args.out))
    stack = Stack(args.out / f"work-floor-{args.model}", model, RunParams(), max(64, args.tokens))
    modes = ("bare", "stock") if args.tokens == 1 else ("stock",)  # bare answers one token
    floors = [FloorService(mode, work, args.tokens, args.token_gap_ms) for mode in modes]
    rounds: list[dict[str, dict[str, Any]]] = []
    try:
        stack.start()
        stack.start_worker(args.model)
        for service in floors:
            service.wait_ready()
        for index in range(args.rounds):
            measured: dict[str, dict[str, Any]] = {}
            for wait, suffix in ((False, ""), (True, "_wait")):
                for service in floors:
                    measured[service.mode + suffix] = measure_floor(service, args.jobs, wait)
                measured["trickle" + suffix] = measure_trickle(
                    stack, args.model, args.jobs, wait, args.tokens
                )
            rounds.append(measured)
            progress(f"round {index + 1}: {json.dumps(measured)}")
    finally:
        for service in floors:
            service.close()
        stack.close()
    result = {
        "model": args.model,
        "jobs": args.jobs,
        "tokens": args.tokens,
        "token_gap_ms": args.token_gap_ms,
        "rounds": rounds,
        "median": summary(rounds),
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"floor-{args.model}-{stamp}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result["median"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
