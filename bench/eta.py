"""How right a queued job's first expected start (ETA) is, measured from outside.

    .venv/bin/python -m bench.eta [--model PATH] [--slots 4] [--max-tokens 64] [--jobs 60]
        [--burst 64] [--seed 7] [--dump PATH]

The stack as ``trickle up`` starts it (bench.outside.start_stack), its one worker given
``--slots`` as the batch size of one ordinary lane (its three overflow lanes run as many, so a
burst runs 4 x ``--slots`` rows at once) so jobs queue; every job a native
``/v1/jobs`` job of ``--max-tokens`` tokens (``ignore_eos``), followed over SSE from its
submission. A job's first ETA is the first ``status`` event that says queued with an
``eta_seconds``, timed as it arrives; its real wait is from that moment to its first token's
arrival (a claimed job may still wait for a lane: the claim is no start). Two loads: Poisson
arrivals at half the worker's measured capacity (jobs per second of a warm full batch), and a
burst of ``--burst`` jobs at once. For each: the jobs that heard an ETA, and the median and
p90 of |ETA - wait| / wait over those that waited at least ``MIN_WAIT_SECONDS`` (a shorter
wait makes any error a large fraction of it). Goal (issue 56): median <= 25 %, p90 <= 50 %.
On a busy machine the figures are indicative only; it says the load it started under.
``--dump``: each job's statuses, first ETA, position and start (relative to its submission)
and the worker's hops, one JSON a line, to see which jobs miss and why.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.log import progress
from bench.harness.stats import percentile
from bench.outside import SERVED_NAME, KeptConnections, job_lines, start_stack
from ops.redis_server import free_port
from trickle.config.settings import PROJECT_ROOT

MIN_WAIT_SECONDS = 0.1


@dataclass
class Waited:
    eta: float | None = None
    eta_at: float = 0.0  # wall clock when the first ETA arrived
    position: int | None = None
    started_at: float | None = None  # wall clock when its first token arrived
    sent_at: float = 0.0  # wall clock just before its POST
    job_id: str = ""
    # Every status event heard before its first token: (wall clock, status, position, eta).
    statuses: list[tuple[float, str, int | None, float | None]] = field(default_factory=list)

    def row(self) -> dict[str, object]:
        """The job as one line of ``--dump``: times relative to its submission."""

        def since(at: float | None) -> float | None:
            return None if at is None else round(at - self.sent_at, 4)

        return {
            "job_id": self.job_id,
            "eta": self.eta,
            "eta_after": since(self.eta_at) if self.eta is not None else None,
            "position": self.position,
            "started_after": since(self.started_at),
            "wait": self.wait,
            "statuses": [
                [since(at), status, position, eta] for at, status, position, eta in self.statuses
            ],
        }

    @property
    def wait(self) -> float | None:
        if self.eta is None or self.started_at is None:
            return None
        return max(self.started_at - self.eta_at, 0.0)


async def one_job(client: KeptConnections, max_tokens: int, to_end: bool = False) -> Waited:
    """Submit one job and follow it until its first token (``to_end``: until its stream ends)."""
    body = {"model": SERVED_NAME, "prompt": "The", "max_tokens": max_tokens, "ignore_eos": True}
    waited = Waited(sent_at=time.time())
    job_id = (await client.post("/v1/jobs", json=body)).json()["id"]
    waited.job_id = job_id
    async with client.stream("GET", f"/v1/jobs/{job_id}/events") as reply:
        event = ""
        async for line in reply.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "status":
                status = json.loads(line[6:])
                eta = status.get("eta_seconds")
                waited.statuses.append((time.time(), status["status"], status.get("position"), eta))
                if waited.eta is None and status["status"] == "queued" and eta is not None:
                    waited.eta, waited.eta_at = float(status["eta_seconds"]), time.time()
                    waited.position = status["position"]
            elif event == "token" and line.startswith("data: ") and waited.started_at is None:
                waited.started_at = time.time()  # its first token: when it started, as seen
                if not to_end:
                    break
    return waited


async def run(
    port: int, count: int, max_tokens: int, rate: float | None, seed: int, to_end: bool = False
) -> list[Waited]:
    """``count`` jobs: Poisson arrivals at ``rate`` a second, or all at once (None); each
    followed until it starts (``to_end``: until it ends)."""
    rng = random.Random(seed)
    # A connection per request: one pooled client held a burst's requests back (its pool
    # hands one idle connection to every queued request: bench.outside.KeptConnections).
    async with KeptConnections(port) as client:
        tasks = []
        for _ in range(count):
            tasks.append(asyncio.create_task(one_job(client, max_tokens, to_end)))
            if rate is not None:
                await asyncio.sleep(rng.expovariate(rate))
        return list(await asyncio.gather(*tasks))


def capacity(port: int, slots: int, max_tokens: int) -> float:
    """Jobs a second the worker finishes with every slot busy: a warm full batch, timed to
    the jobs' ends (timed to their first tokens, with overflow lanes taking a dozen jobs at
    once, it read up to ten times the rate the worker sustains)."""
    asyncio.run(run(port, slots, max_tokens, None, 0, to_end=True))  # warm
    began = time.perf_counter()
    asyncio.run(run(port, slots * 3, max_tokens, None, 0, to_end=True))
    return slots * 3 / (time.perf_counter() - began)


def report(name: str, results: list[Waited]) -> dict[str, float | int | None]:
    heard = [(r.eta, r.wait) for r in results if r.eta is not None and r.wait is not None]
    signed = sorted((eta - wait) / wait for eta, wait in heard if wait >= MIN_WAIT_SECONDS)
    errors = sorted(abs(error) for error in signed)
    unheard = [
        r.started_at - r.sent_at for r in results if r.eta is None and r.started_at is not None
    ]
    row: dict[str, float | int | None] = {
        "jobs": len(results),
        "heard_eta": len(heard),
        "waited": len(errors),
        "median_error": percentile(errors, 50) if errors else None,
        "p90_error": percentile(errors, 90) if errors else None,
        "mean_wait_s": sum(wait for _eta, wait in heard) / len(heard) if heard else None,
        # (ETA - wait) / wait: below 0, the estimates were short.
        "median_signed_error": percentile(signed, 50) if signed else None,
        "unheard_max_start_s": max(unheard) if unheard else None,
    }
    median, p90 = row["median_error"], row["p90_error"]
    progress(
        f"{name}: {row['jobs']} jobs, {row['heard_eta']} heard an ETA, {row['waited']} waited "
        f">= {MIN_WAIT_SECONDS} s; |error|/wait median "
        f"{'-' if median is None else f'{median:.0%}'}, p90 {'-' if p90 is None else f'{p90:.0%}'}"
        " (goal 25 % / 50 %)"
    )
    bias, slowest = row["median_signed_error"], row["unheard_max_start_s"]
    progress(
        f"  signed (ETA - wait)/wait median {'-' if bias is None else f'{bias:+.0%}'}; "
        f"{len(unheard)} heard no ETA, the last of them started "
        f"{'-' if slowest is None else f'{slowest:.2f} s'} after its submission"
    )
    return row


def dump(path: Path, loads: dict[str, list[Waited]], log: Path) -> None:
    """Each job's row, with the worker's hop times from its job log (``bench.outside``)."""
    finished = job_lines(log)
    with path.open("w") as out:
        for name, results in loads.items():
            for index, result in enumerate(results):
                hops = finished.get(result.job_id, {})
                worker = {key: value for key, value in hops.items() if key.endswith("_seconds")}
                for note in ("lanes_at_arrival", "started_in", "restarts"):
                    worker[note] = hops.get(note)
                line = {"load": name, "index": index, **result.row(), "worker": worker}
                out.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=PROJECT_ROOT / "models" / "demo")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--burst", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dump", type=Path, help="each job's ETAs and start, one JSON a line")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    progress(f"load average {load:.2f}{'' if load < 1 else ' (not quiet: figures indicative)'}")
    name = SERVED_NAME.upper()
    extra = {
        f"TRICKLE__MODELS__{name}__MAX_BATCH_SIZE": str(args.slots),
        f"TRICKLE__MODELS__{name}__INTER_THREADS": "1",
    }
    rows = {}
    with tempfile.TemporaryDirectory(prefix="trickle-eta-") as work_dir:
        port = free_port()
        stack = start_stack(args.model, Path(work_dir), port, extra)
        try:
            jobs_per_second = capacity(port, args.slots, args.max_tokens)
            progress(f"capacity {jobs_per_second:.1f} jobs/s ({args.slots} slots)")
            rate = 0.5 * jobs_per_second
            poisson = asyncio.run(run(port, args.jobs, args.max_tokens, rate, args.seed))
            rows["poisson_0.5x"] = report(f"Poisson at 0.5x ({rate:.1f} jobs/s)", poisson)
            burst = asyncio.run(run(port, args.burst, args.max_tokens, None, args.seed))
            rows[f"burst_{args.burst}"] = report(f"burst of {args.burst}", burst)
            if args.dump:
                dump(args.dump, {"poisson": poisson, "burst": burst}, Path(work_dir) / "up.log")
        finally:
            stack.terminate()
            stack.wait(30)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
