"""Load as an outsider measures it, so the inside benchmarks can be held to the same figures.

    .venv/bin/python -m bench.outside [--model 46m-outside|demo|models/smollm2]
        [--rates 0.15,0.3,0.5] [--requests 120] [--max-tokens 128] [--seed 7] [--out DIR]

The method (issue 53): the stack started as ``make up`` starts it (``trickle up``, a fresh
embedded Redis, the Procfile's web and worker), the model served by environment variables alone
(``TRICKLE_DEFAULT_MODEL``, ``TRICKLE__MODELS__<NAME>__PATH``); open-loop Poisson arrivals
(seeded) of streamed ``/v1/completions`` ("The socket module", ``ignore_eos``, temperature 0,
``stream_options.include_usage``) from asyncio ``httpx`` with keep-alive, each request on a
connection of its own (``KeptConnections``: one pooled client held requests back), TTFT timed
from just before each request is sent; the rate a fraction of CTranslate2's own
``generate_batch(32)`` tokens/s on the same model (best of its compute types and 1-2 intra
threads), measured in the same run before the stack starts.

What ``bench.load`` does not: for the worst five arrivals of each rate it prints where each
waited, hop by hop, from the worker's job log (``queue_wait``, ``claim``, ``batch_wait``,
``first_step``, ``first_publish``: worker/job_trace.py), so a slow first token is named, not
guessed. Run it on a quiet machine (load average under 1); it says the load it started under.

Served tokens are the streams' own counts (``usage.completion_tokens``): a chunk carries every
token of one paced message, so counting chunks (as this bench did until 2026-12-07) read about
half the tokens at 1.0x on the demo. ITL stays the gap between chunks, as a client reads it.
Each load also charges every process's CPU (the web, the worker, its engine processes, Redis,
the rest of ``trickle up``, and this client) to the delivered tokens, sets the serving path's
share (web + worker + Redis) against CTranslate2's own CPU per token at batch 32, and says
what tokens/s the cores allow at those costs: with everything on them, with the client
elsewhere, and for the engine alone beside the client (a serving path that cost nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.harness import models
from bench.harness.arrivals import poisson_offsets
from bench.harness.capacity import Capacity, batch_capacity
from bench.harness.engine_slots import ArrivedJob
from bench.harness.goodput import goals_for, met_goals
from bench.harness.log import progress
from bench.harness.stack import cpu_of, up_roles, us_per_token
from bench.harness.stats import percentile
from ops.redis_server import free_port
from trickle.config.sections import ModelSettings
from trickle.config.settings import PROJECT_ROOT
from trickle.tokenization.loading import load_tokenizer

PROMPT = "The socket module"
SERVED_NAME = "outside"
JOB_LINE = re.compile(r"INFO:trickle\.jobs:(\{.*\})")
HOPS = ("queue_wait", "claim", "batch_wait", "first_step", "first_publish")
SERVING_PATH = ("web", "worker", "redis")  # issue 53, item 3: its CPU per token


@dataclass
class Arrival:
    due_at: float = 0.0  # when the open-loop schedule had it sent (perf_counter)
    sent_at: float = 0.0
    job_id: str = ""
    # When each chunk with text came: a chunk carries every token of one paced message, so
    # these are not tokens (ITL here is the gap between chunks, as a client reads it).
    token_times: list[float] = field(default_factory=list)
    tokens: int = 0  # the stream's own count (``usage.completion_tokens``, its last chunk)
    error: str = ""
    # httpcore's trace of the request: each event's name and when it came (perf_counter), so
    # a slow or broken request shows which hop the client spent its time in.
    trace: list[tuple[str, float]] = field(default_factory=list)

    async def traced(self, name: str, _info: dict[str, Any]) -> None:
        self.trace.append((name, time.perf_counter()))

    def client_ms(self, event: str) -> float | None:
        """When ``event`` of the trace came, in ms after the request was due to be sent."""
        at = next((t for name, t in self.trace if name == event), None)
        return (at - self.sent_at) * 1000 if at is not None else None

    @property
    def client_wait_ms(self) -> tuple[float, float] | None:
        """The client's own delays: its task's start after the request was due (its event
        loop's lag), and from there to the first network step (a new connection's connect,
        or the request written on a kept one: the pool's and the loop's wait)."""
        if not self.trace:
            return None
        return (self.sent_at - self.due_at) * 1000, (self.trace[0][1] - self.sent_at) * 1000

    @property
    def ttft_ms(self) -> float | None:
        return (self.token_times[0] - self.sent_at) * 1000 if self.token_times else None


def engine_capacity(path: Path, max_tokens: int) -> Capacity:
    """CTranslate2 alone: the best batch-32 tokens/s (``bench.harness.capacity``), the prompt
    tokenized as the stack will (the directory's ``tokenizer.json`` or ``tokenizer.model``)."""
    tokenizer = load_tokenizer(ModelSettings(name=SERVED_NAME, path=str(path)))
    return batch_capacity(path, tokenizer.to_pieces(tokenizer.encode(PROMPT)), max_tokens)


class CpuCharge:
    """Every process's CPU over one load, by role (``up_roles``, and this client), charged
    to the tokens the clients received."""

    def __init__(self, root: int):
        self._roles = up_roles(root)
        self._before = self._read()

    def _read(self) -> dict[str, float]:
        return {**cpu_of(self._roles), "client": time.process_time()}

    def per_token(self, tokens: int) -> dict[str, float]:
        after = self._read()
        return us_per_token({role: after[role] - self._before[role] for role in after}, tokens)


def ceilings(cpu_us: dict[str, float], engine_alone_us: float, cores: int) -> dict[str, float]:
    """The tokens/s these cores allow when every token costs what this load measured: the
    whole (engine, serving path, other processes and this client, all on the same cores), the
    same without the client's share (a client on another machine), and the engine alone's
    own CPU per token with only the client beside it (a serving path that cost nothing)."""
    whole = sum(cpu_us.values())

    def rate(us: float) -> float:
        return round(cores * 1e6 / us) if us > 0 else 0.0

    return {
        "all_on_these_cores": rate(whole),
        "client_elsewhere": rate(whole - cpu_us.get("client", 0.0)),
        "engine_alone_and_client": rate(engine_alone_us + cpu_us.get("client", 0.0)),
    }


def start_stack(
    path: Path, work: Path, port: int, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``make up``'s stack with the model served by configuration (``extra_env``: more of
    it), its output in work/up.log."""
    env = {
        **os.environ,
        **(extra_env or {}),
        "TRICKLE_PORT": str(port),
        "TRICKLE__REDIS__URL": f"redis://127.0.0.1:{free_port()}/0",
        "TRICKLE_DEFAULT_MODEL": SERVED_NAME,
        f"TRICKLE__MODELS__{SERVED_NAME.upper()}__PATH": str(path),
    }
    trickle = Path(sys.executable).parent / "trickle"
    log = (work / "up.log").open("wb")
    process = subprocess.Popen(
        [str(trickle), "up", "--data-dir", str(work)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=PROJECT_ROOT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.5)
    process.terminate()
    tail = (work / "up.log").read_text("utf-8", "replace")[-3000:]
    raise RuntimeError(f"the stack did not get ready; its log ends:\n{tail}")


async def send(client: KeptConnections, arrival: Arrival, max_tokens: int) -> None:
    body = {
        "model": SERVED_NAME,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    arrival.sent_at = time.perf_counter()
    try:
        async with client.stream(
            "POST", "/v1/completions", json=body, extensions={"trace": arrival.traced}
        ) as response:
            if response.status_code != 200:
                arrival.error = f"HTTP {response.status_code}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                arrival.job_id = arrival.job_id or chunk.get("id", "")
                if chunk.get("usage"):
                    arrival.tokens = chunk["usage"].get("completion_tokens", 0)
                if any(choice.get("text") for choice in chunk.get("choices") or ()):
                    arrival.token_times.append(time.perf_counter())
    except httpx.HTTPError as exc:
        # Where the stream broke tells a keep-alive race (nothing read) from a stream cut short.
        after = time.perf_counter() - arrival.sent_at
        reached = [event for event in arrival.trace if "response_closed" not in event[0]]
        last = reached[-1] if reached else ("no trace", arrival.sent_at)
        # A kept-alive connection the server closed as it was reused (its keep-alive timer
        # against the client's) connects nothing and breaks once the request is written.
        reused = not any(name.startswith("connection.connect_tcp") for name, _ in arrival.trace)
        arrival.error = (
            f"{type(exc).__name__} after {len(arrival.token_times)} chunks, {after:.1f} s, "
            f"job {arrival.job_id or 'unknown'}, {'reused' if reused else 'new'} connection; "
            f"last: {last[0]} at {last[1] - arrival.sent_at:.1f} s"
        )


class KeptConnections:
    """The outside method's client: ``httpx`` with keep-alive, every request on a connection
    of its own, so open-loop arrivals never wait in the client.

    One ``httpx.AsyncClient`` with an unbounded pool did not send open-loop: httpcore 1.0.9's
    pool hands one idle connection to every request queued in the same pass
    (``_assign_requests_to_connections``; encode/httpcore#1035, pydantic/httpx2#1075), the
    losers wait for the pool's next pass, and at 0.5x on the demo the slowest requests
    reached the network 15.7 s after they were sent (p99), while the client spent 274-304 µs
    of CPU per token it read (docs/performance.md). So each connection is a client of its
    own with one connection kept alive, lent to one request at a time: a request takes an
    idle one, or a new one when none is idle, and gives it back when its response closes.
    """

    def __init__(self, port: int):
        self._base_url = f"http://127.0.0.1:{port}"
        # One for all: a client of its own builds one, 65 ms of CPU with the CA bundle loaded.
        self._tls = ssl.create_default_context()
        self._idle: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []

    def _client(self) -> httpx.AsyncClient:
        if self._idle:
            return self._idle.pop()
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        client = httpx.AsyncClient(
            base_url=self._base_url, timeout=None, limits=limits, verify=self._tls
        )
        self._all.append(client)
        return client

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        client = self._client()
        try:
            async with client.stream(method, url, **kwargs) as response:
                yield response
        finally:
            self._idle.append(client)

    async def post(self, url: str, **kwargs: Any) -> httpx.Response:
        """A whole (not streamed) POST on a lent connection."""
        client = self._client()
        try:
            return await client.post(url, **kwargs)
        finally:
            self._idle.append(client)

    async def __aenter__(self) -> KeptConnections:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        for client in self._all:
            await client.aclose()


async def loop_lag(lags: list[float], stop: asyncio.Event, tick: float = 0.02) -> None:
    """How late the client's event loop wakes a 20 ms sleep, in ms, until ``stop``: a
    loop that falls behind delays every send and every chunk it reads by as much."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + tick
        await asyncio.sleep(tick)
        lags.append((loop.time() - due) * 1000)


async def run_rate(
    port: int, rate: float, count: int, max_tokens: int, seed: int, lags: list[float]
) -> list[Arrival]:
    """Send ``count`` streamed requests at Poisson times; ``lags`` gets the loop's lateness."""
    arrivals = [Arrival() for _ in range(count)]
    stop = asyncio.Event()
    monitor = asyncio.create_task(loop_lag(lags, stop))
    async with KeptConnections(port) as client:
        tasks = []
        loop = asyncio.get_running_loop()
        start, start_clock = loop.time(), time.perf_counter()
        # Each send is due at its offset from the start, so slow sends add no drift.
        for arrival, offset in zip(arrivals, poisson_offsets(rate, count, seed), strict=True):
            arrival.due_at = start_clock + offset
            await asyncio.sleep(max(0.0, start + offset - loop.time()))
            tasks.append(asyncio.create_task(send(client, arrival, max_tokens)))
        await asyncio.gather(*tasks)
    stop.set()
    await monitor
    return arrivals


def job_lines(log: Path) -> dict[str, dict[str, Any]]:
    """Each job's ``finished`` line from the worker's job log."""
    finished: dict[str, dict[str, Any]] = {}
    for match in JOB_LINE.finditer(log.read_text("utf-8", "replace")):
        event = json.loads(match[1])
        if event.get("event") == "finished":
            finished[event["job_id"]] = event
    return finished


def delivered_tokens(arrivals: list[Arrival]) -> int:
    """Tokens the clients received: each stream's own count, its chunks where it gave none."""
    return sum(a.tokens or len(a.token_times) for a in arrivals if not a.error)


def client_waits(arrivals: list[Arrival]) -> dict[str, dict[str, float | None]]:
    """p50 and p99 of the client's own two waits (``Arrival.client_wait_ms``)."""
    waits = [w for w in (a.client_wait_ms for a in arrivals) if w is not None]
    return {
        name: {
            "p50": percentile([w[i] for w in waits], 50),
            "p99": percentile([w[i] for w in waits], 99),
        }
        for i, name in enumerate(("task_start", "to_network"))
    }


def summarize(
    rate_x: float,
    req_s: float,
    arrivals: list[Arrival],
    jobs: dict[str, dict[str, Any]],
    cpu_us: dict[str, float],
    engine_alone_us: float,
    loop_lags: list[float],
) -> dict[str, Any]:
    ok = [a for a in arrivals if a.ttft_ms is not None and not a.error]
    good = {id(a) for a in ok}
    ttfts = [a.ttft_ms for a in ok if a.ttft_ms is not None]
    itls = [
        (b - a) * 1000 for x in ok for a, b in zip(x.token_times, x.token_times[1:], strict=False)
    ]
    span = max(a.token_times[-1] for a in ok) - min(a.sent_at for a in ok) if ok else 0
    worst = sorted(ok, key=lambda a: a.ttft_ms or 0, reverse=True)[:5]
    # Issue 53's goodput, as bench.engine_arrivals counts it on the same arrivals: the jobs
    # that met both goals on their own (TTFT from the send, ITL between chunks), per second
    # of the run, against the capacity in jobs/s; a failed request met none.
    goals = goals_for(rate_x)
    met = sum(
        met_goals(ArrivedJob(i, a.sent_at, None, a.token_times), goals) for i, a in enumerate(ok)
    )
    return {
        "rate_x": rate_x,
        "requests_per_second": req_s,
        "ok": len(ok),
        "failed": len(arrivals) - len(ok),
        "failures": sorted({a.error or "no token" for a in arrivals if id(a) not in good})[:5],
        "ttft_ms": {"p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99)},
        "itl_ms_p99": percentile(itls, 99),
        "client_wait_ms": client_waits(ok),
        "client_loop_lag_ms": {
            "p50": percentile(loop_lags, 50),
            "p99": percentile(loop_lags, 99),
            "max": max(loop_lags, default=0.0),
        },
        "tokens_per_second": delivered_tokens(ok) / span if span else 0,
        "chunks_per_second": sum(len(a.token_times) for a in ok) / span if span else 0,
        "good_jobs": met,
        "goodput_x_capacity": met / span / (req_s / rate_x) if span and req_s else 0,
        "cpu_us_per_token": cpu_us,
        "serving_path_x_engine": round(
            sum(cpu_us.get(role, 0.0) for role in SERVING_PATH) / engine_alone_us, 2
        )
        if engine_alone_us
        else None,
        "ceiling_tokens_per_second": ceilings(
            cpu_us, engine_alone_us, len(os.sched_getaffinity(0))
        ),
        "worst": [
            {
                "job_id": a.job_id,
                "ttft_ms": a.ttft_ms,
                "worker_ttft_ms": 1000 * jobs.get(a.job_id, {}).get("ttft_seconds", float("nan")),
                # "connected" empty: a kept-alive connection was reused.
                "connected_ms": a.client_ms("connection.connect_tcp.complete"),
                "sent_ms": a.client_ms("http11.send_request_body.complete"),
                "trace_ms": [(name, (t - a.sent_at) * 1000) for name, t in a.trace],
                "headers_ms": a.client_ms("http11.receive_response_headers.complete"),
                **{hop: 1000 * jobs.get(a.job_id, {}).get(f"{hop}_seconds", 0.0) for hop in HOPS},
                "lanes_at_arrival": jobs.get(a.job_id, {}).get("lanes_at_arrival", ""),
                "started_in": jobs.get(a.job_id, {}).get("started_in", ""),
            }
            for a in worst
        ],
    }


def print_report(
    model: str, capacity: float, how: str, alone_us: float, rows: list[dict[str, Any]]
) -> None:
    alone = f", {alone_us:.0f} µs of CPU a token" if alone_us else ""
    print(f"\n## {model}: engine batch-32 {capacity:,.0f} tok/s ({how}{alone})\n")
    print(
        "| load | req/s | TTFT p50 | TTFT p99 | ITL p99 (chunks) | tok/s served | chunks/s "
        "| failed | met both goals | goodput x capacity |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for row in rows:
        t = row["ttft_ms"]
        print(
            f"| {row['rate_x']}x | {row['requests_per_second']:.2f} | {t['p50']:.0f} ms | "
            f"{t['p99']:.0f} ms | {row['itl_ms_p99']:.0f} ms | "
            f"{row['tokens_per_second']:.0f} | {row['chunks_per_second']:.0f} | {row['failed']} | "
            f"{row['good_jobs']}/{row['ok'] + row['failed']} | {row['goodput_x_capacity']:.2f} |"
        )
    for row in rows:
        for failure in row["failures"]:
            print(f"- {row['rate_x']}x failed: {failure}")
    print("\nThe client's own wait before its request reached the network (ms, p50 / p99): its")
    print("task's start after the request was due, then to its connect or its write:\n")
    for row in rows:
        task, network = row["client_wait_ms"]["task_start"], row["client_wait_ms"]["to_network"]
        lag = row["client_loop_lag_ms"]
        print(
            f"- {row['rate_x']}x: task {task['p50'] or 0:.0f} / {task['p99'] or 0:.0f}, "
            f"to the network {network['p50'] or 0:.0f} / {network['p99'] or 0:.0f}; the "
            f"loop's lag (a 20 ms sleep's) {lag['p50'] or 0:.0f} / {lag['p99'] or 0:.0f}, "
            f"at most {lag['max']:.0f}"
        )
    print("\nCPU per delivered token (µs), the serving path (web + worker + Redis) against the")
    print("engine alone's own, and the tokens/s these cores allow at these costs:\n")
    print("| load | web | worker | engine | redis | other | client | path ÷ engine alone |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for row in rows:
        cpu = row["cpu_us_per_token"]
        roles = " | ".join(
            f"{cpu.get(r, 0):.0f}" for r in ("web", "worker", "engine", "redis", "other", "client")
        )
        print(f"| {row['rate_x']}x | {roles} | {row['serving_path_x_engine']} |")
    for row in rows:
        c = row["ceiling_tokens_per_second"]
        print(
            f"- {row['rate_x']}x: {c['all_on_these_cores']:,.0f} tok/s with everything on these "
            f"cores, {c['client_elsewhere']:,.0f} with the client elsewhere, "
            f"{c['engine_alone_and_client']:,.0f} for the engine alone beside the client"
        )
    print("\nThe worst five of each load, hop by hop (ms; worker log):\n")
    print("(the client's own: when its new connection was made, blank for a reused one, its")
    print("request written and the answer's headers read)\n")
    print(
        "| load | client TTFT | connected | request written | headers read | worker TTFT | "
        + " | ".join(HOPS)
        + " |"
    )
    print("|---|--:|--:|--:|--:|--:|" + "--:|" * len(HOPS))
    for row in rows:
        for w in row["worst"]:
            hops = " | ".join(f"{w[hop]:.0f}" for hop in HOPS)
            client = " | ".join(
                "" if w.get(k) is None else f"{w[k]:.0f}"
                for k in ("connected_ms", "sent_ms", "headers_ms")
            )
            print(
                f"| {row['rate_x']}x | {w['ttft_ms']:.0f} | {client} | "
                f"{w['worker_ttft_ms']:.0f} | {hops} |"
            )
    print("\nWhat the lanes were doing when each arrived (``o:live/steps`` an ordinary lane's")
    print("batch, ``r:`` a spare lane's, ``!`` a restart due), and the batch it started in:\n")
    for row in rows:
        for w in row["worst"]:
            print(f"- {row['rate_x']}x {w['ttft_ms']:.0f} ms: {w.get('lanes_at_arrival', '')}")
            print(f"  -> {w.get('started_in', '')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="46m-outside", help="a bench model key, or a path")
    parser.add_argument("--rates", default="0.15,0.3,0.5")
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--capacity",
        type=float,
        default=None,
        help="the engine's batch-32 tokens/s, given (default: measured in this run)",
    )
    parser.add_argument(
        "--engine-cpu-us",
        type=float,
        default=0.0,
        help="with --capacity: the engine alone's CPU per token at batch 32, in µs",
    )
    parser.add_argument(
        "--keep-log", type=Path, default=None, help="copy the stack's log (with the job log) here"
    )
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    progress(f"load average {load:.2f}{'' if load < 1 else ' (not quiet: figures suspect)'}")
    path = Path(args.model).resolve() if "/" in args.model else models.prepare(args.model).path
    measured = None if args.capacity else engine_capacity(path, args.max_tokens)
    capacity = measured.tokens_per_s if measured else args.capacity
    how = measured.describe() if measured else "given"
    alone_us = measured.cpu_us_per_token if measured else args.engine_cpu_us
    progress(f"engine alone, batch 32: {capacity:,.0f} tok/s ({how}), {alone_us:.0f} µs a token")
    rows = []
    with tempfile.TemporaryDirectory(prefix="trickle-outside-") as work_dir:
        work, port = Path(work_dir), free_port()
        stack = start_stack(path, work, port)
        try:
            for rate_x in (float(r) for r in args.rates.split(",")):
                req_s = rate_x * capacity / args.max_tokens
                progress(f"{rate_x}x: {req_s:.2f} req/s, {args.requests} requests")
                charge = CpuCharge(stack.pid)
                lags: list[float] = []
                arrivals = asyncio.run(
                    run_rate(port, req_s, args.requests, args.max_tokens, args.seed, lags)
                )
                cpu_us = charge.per_token(delivered_tokens(arrivals))
                time.sleep(3)  # the finished lines are written just after the results
                jobs = job_lines(work / "up.log")
                rows.append(summarize(rate_x, req_s, arrivals, jobs, cpu_us, alone_us, lags))
        finally:
            stack.terminate()
            if args.keep_log:
                shutil.copyfile(work / "up.log", args.keep_log)
            stack.wait(30)
    print_report(args.model, capacity, how, alone_us, rows)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"outside-{Path(args.model).name}-{int(time.time())}.json"
    out.write_text(json.dumps({"model": args.model, "capacity": capacity, "rows": rows}, indent=1))
    progress(f"raw figures: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
