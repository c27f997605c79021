"""Does a batch stall the web tier? /healthz timed through a batch's whole life, per phase.

    .venv/bin/python -m bench.batch_stall                         # 3,000 lines, 2 runs
    .venv/bin/python -m bench.batch_stall --lines 10000 --runs 1
    .venv/bin/python -m bench.batch_stall --batch-niceness 0      # the batch tier unniced
    .venv/bin/python -m bench.batch_stall --runs 6 --alternate 0  # nice 10 and 0 in turns

On a stack as ``trickle up`` runs the Procfile (its own Redis; gunicorn + gevent, the batch
consumer and one demo-model worker, each in a session of its own), a client POSTs a JSONL
batch of ``--lines`` one-token completion lines to ``/v1/batches`` with an
``Idempotency-Key``. Meanwhile another thread GETs ``/healthz`` every 10 ms on its own
connection, from before the POST until the output file has been read back.
Each answer is charged to the batch's phase when it was asked: ``post`` (the POST in flight),
``validating`` (the consumer reads the input into jobs), ``in_progress`` (the worker runs
them), ``finalizing`` (the consumer settles them into the output file), ``completed`` (the
output file read back). Printed per phase: answers, p50 / p99 / max, how many took 50 ms or
more (issue 51's goal: none).

Where a slow answer's time went, per answer, from the web process's main thread (the gevent
loop) in ``/proc/<pid>/schedstat``: its CPU time and its run delay (time runnable but waiting
for a core) across the request. Printed for the answers of 50 ms or more: the share of their
time that was run delay (the machine's other processes held the cores) and that was the web's
own CPU (the web was busy), and the polling thread's own run delay (the client waited for a
core). /healthz reads nothing from Redis, so those are the hops.

``--batch-niceness`` sets ``supervisor.batch_niceness`` in the stack's config (what the
launcher applies to the batch consumer); default: the configuration's default. ``--alternate
NICE`` renices the consumer (its threads and its session's autogroup) to NICE for every other
run on the same stack, so both settings are measured minutes apart on one machine's load
(renicing back down needs root or CAP_SYS_NICE).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench.harness.log import progress
from bench.harness.models import prepare
from bench.harness.stack import child_pids
from bench.harness.stats import percentile
from ops.stack import LocalStack

POLL_SECONDS = 0.010
SLOW_SECONDS = 0.050
PHASES = ("post", "validating", "in_progress", "finalizing", "completed")


def batch_body(lines: int, model: str) -> bytes:
    line = {"method": "POST", "url": "/v1/completions"}
    body = {"model": model, "prompt": "The", "max_tokens": 1}
    return "".join(
        json.dumps({"custom_id": f"line-{i}", **line, "body": body}) + "\n" for i in range(lines)
    ).encode()


def schedstat(pid: int) -> tuple[float, float]:
    """The thread's CPU time and run delay (runnable, waiting for a core), in seconds."""
    return schedstat_of(str(pid))


def schedstat_of(task: str) -> tuple[float, float]:
    with open(f"/proc/{task}/schedstat") as stat:
        ran, waited, _ = stat.read().split()
    return int(ran) / 1e9, int(waited) / 1e9


def others_ran(pid: int | str, but: str) -> float:
    """CPU seconds of ``pid``'s threads other than ``but``: who may hold the GIL meanwhile."""
    total = 0.0
    for task in os.listdir(f"/proc/{pid}/task"):
        if task != but:
            try:
                total += schedstat_of(f"{pid}/task/{task}")[0]
            except OSError:  # the thread ended
                continue
    return total


@dataclass
class Probe:
    phase: str
    wait: float
    ran: float  # the web's main thread's CPU time across the request
    delayed: float  # its run delay across the request
    client_delayed: float  # the polling thread's own run delay across it
    client_ran: float  # the polling thread's own CPU across it
    web_others: float  # the web process's other threads' CPU across it
    client_others: float  # the benchmark's other threads' CPU across it


@dataclass
class Poller:
    """GETs /healthz every 10 ms, charging each answer to ``phase`` as it was when asked."""

    base: str
    web_pid: int
    phase: str = "before"
    probes: list[Probe] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with requests.Session() as session:
            while not self.done.is_set():
                phase = self.phase
                me = str(threading.get_native_id())
                ran, delayed = schedstat(self.web_pid)
                web_others = others_ran(self.web_pid, str(self.web_pid))
                client_others = others_ran(os.getpid(), me)
                my_cpu, mine = schedstat_of("thread-self")
                asked = time.perf_counter()
                session.get(f"{self.base}/healthz", timeout=30).raise_for_status()
                wait = time.perf_counter() - asked
                my_cpu_after, mine_after = schedstat_of("thread-self")
                ran_after, delayed_after = schedstat(self.web_pid)
                self.probes.append(
                    Probe(
                        phase,
                        wait,
                        ran_after - ran,
                        delayed_after - delayed,
                        mine_after - mine,
                        my_cpu_after - my_cpu,
                        others_ran(self.web_pid, str(self.web_pid)) - web_others,
                        others_ran(os.getpid(), me) - client_others,
                    )
                )
                time.sleep(POLL_SECONDS)


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(tree_cpu(child) for child in child_pids(pid))


@dataclass
class CpuMeter:
    """The CPU seconds each of the stack's processes (with its children) spent per phase."""

    pids: dict[str, int]
    spent: dict[str, dict[str, float]] = field(default_factory=dict)
    phase: str = ""
    at: dict[str, float] = field(default_factory=dict)
    wall: dict[str, float] = field(default_factory=dict)
    since: float = 0.0

    def enter(self, phase: str) -> None:
        if phase == self.phase:
            return
        now = {name: tree_cpu(pid) for name, pid in self.pids.items()}
        clock = time.perf_counter()
        if self.phase:
            row = self.spent.setdefault(self.phase, dict.fromkeys(self.pids, 0.0))
            for name in self.pids:
                row[name] += now[name] - self.at[name]
            self.wall[self.phase] = self.wall.get(self.phase, 0.0) + clock - self.since
        self.phase, self.at, self.since = phase, now, clock


def one_run(
    base: str, web_pid: int, pids: dict[str, int], payload: bytes, lines: int
) -> tuple[list[Probe], CpuMeter]:
    poller = Poller(base, web_pid)
    meter = CpuMeter(pids)
    thread = threading.Thread(target=poller.run)
    thread.start()
    time.sleep(0.3)  # the poller's own connection is up and warm
    headers = {"Content-Type": "application/jsonl", "Idempotency-Key": f"bench-{uuid.uuid4()}"}
    try:
        poller.phase = "post"
        meter.enter("post")
        answer = requests.post(f"{base}/v1/batches", data=payload, headers=headers, timeout=600)
        answer.raise_for_status()
        batch = answer.json()
        deadline = time.monotonic() + 900
        while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
            poller.phase = batch["status"]
            meter.enter(batch["status"])
            time.sleep(0.1)
            batch = requests.get(f"{base}/v1/batches/{batch['id']}", timeout=60).json()
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch still {batch['status']}")
        poller.phase = "completed"
        meter.enter("completed")
        output = requests.get(f"{base}/v1/files/{batch['output_file_id']}/content", timeout=60)
        written = output.content.count(b"\n")
        if batch["status"] != "completed" or written != lines:
            raise RuntimeError(f"batch {batch['status']}, {written} of {lines} lines written")
        time.sleep(0.3)
        meter.enter("end")
    finally:
        poller.done.set()
        thread.join()
    return [probe for probe in poller.probes if probe.phase != "before"], meter


def ms(seconds: float | None) -> str:
    return f"{1000 * (seconds or 0.0):.1f}"


def report(probes: list[Probe], meter: CpuMeter, label: str) -> None:
    print(f"\n{label}: GET /healthz every 10 ms through the batch's life")
    print("| phase | answers | p50 / p99 / max ms | >= 50 ms |")
    print("|---|---|---|---|")
    for phase in (*PHASES, "all"):
        waits = [p.wait for p in probes if phase in (p.phase, "all")]
        if not waits:
            continue
        slow = sum(w >= SLOW_SECONDS for w in waits)
        print(
            f"| {phase} | {len(waits)} | {ms(percentile(waits, 50))} / "
            f"{ms(percentile(waits, 99))} / {ms(max(waits))} | {slow} |"
        )
    names = list(meter.pids)
    print("\nCPU seconds per phase (each process with its children), and the phase's wall time")
    print(f"| phase | wall s | {' | '.join(names)} |")
    print(f"|---|---|{'---|' * len(names)}")
    for phase, row in meter.spent.items():
        cells = " | ".join(f"{row[name]:.2f}" for name in names)
        print(f"| {phase} | {meter.wall[phase]:.2f} | {cells} |")
    slow_probes = [p for p in probes if p.wait >= SLOW_SECONDS]
    if slow_probes:
        total = sum(p.wait for p in slow_probes)
        delayed = sum(p.delayed for p in slow_probes)
        ran = sum(p.ran for p in slow_probes)
        client = sum(p.client_delayed for p in slow_probes)
        client_ran = sum(p.client_ran for p in slow_probes)
        web_others = sum(p.web_others for p in slow_probes)
        client_others = sum(p.client_others for p in slow_probes)
        print(
            f"{len(slow_probes)} answers of 50 ms or more, {1000 * total:.0f} ms: the web's run "
            f"delay {100 * delayed / total:.0f}%, its CPU {100 * ran / total:.0f}%, its other "
            f"threads' CPU {100 * web_others / total:.0f}%; the polling client's run delay "
            f"{100 * client / total:.0f}%, its CPU {100 * client_ran / total:.0f}%, the "
            f"benchmark's other threads' CPU {100 * client_others / total:.0f}%"
        )
        for p in sorted(slow_probes, key=lambda p: -p.wait)[:5]:
            print(
                f"  {ms(p.wait)} ms ({p.phase}): web run delay {ms(p.delayed)}, CPU {ms(p.ran)}, "
                f"other threads {ms(p.web_others)}; client run delay {ms(p.client_delayed)}, "
                f"CPU {ms(p.client_ran)}, other threads {ms(p.client_others)}"
            )


def renice(pid: int, nice: int) -> None:
    """Every thread of ``pid`` at ``nice``, and its session's autogroup (``ops.priority``)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(task), nice)
    if os.getsid(pid) == pid and os.path.exists(f"/proc/{pid}/autogroup"):
        with open(f"/proc/{pid}/autogroup", "w") as group:
            group.write(f"{nice}\n")


def summary(rows: list[tuple[int, list[Probe]]], load: float) -> None:
    print(f"\nEvery run, in order (load average at the end {load:.1f})")
    print(
        "| run | batch nice | answers | /healthz p50 / p99 / max ms | >= 50 ms | web run delay "
        "| >= 50 ms less the client's own run delay |"
    )
    print("|---|---|---|---|---|---|---|")
    for run, (nice, probes) in enumerate(rows, 1):
        waits = [p.wait for p in probes]
        slow = [p for p in probes if p.wait >= SLOW_SECONDS]
        share = sum(p.delayed for p in slow) / max(sum(p.wait for p in slow), 1e-9)
        served = sum(p.wait - p.client_delayed >= SLOW_SECONDS for p in slow)
        print(
            f"| {run} | {nice} | {len(waits)} | {ms(percentile(waits, 50))} / "
            f"{ms(percentile(waits, 99))} / {ms(max(waits))} | {len(slow)} | {100 * share:.0f}% "
            f"| {served} |"
        )


def config_text(redis_url: str, model_dir: Path, niceness: int | None) -> str:
    supervisor = "" if niceness is None else f"[supervisor]\nbatch_niceness = {niceness}\n"
    return (
        f'default_model = "demo"\n[redis]\nurl = "{redis_url}"\n'
        f"[limits]\nmax_batch_backlog = 10000000\n"
        f"[files]\nbatch_sweep_seconds = 0.5\n{supervisor}"
        f'[models.demo]\npath = "{model_dir}"\n'
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_stall", description=__doc__)
    parser.add_argument("--lines", type=int, default=3_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--batch-niceness", type=int, default=None)
    parser.add_argument(
        "--alternate",
        type=int,
        default=None,
        metavar="NICE",
        help="every other run with the batch consumer reniced to NICE (back needs root)",
    )
    args = parser.parse_args(argv)
    model = prepare("demo")
    payload = batch_body(args.lines, model.key)
    with tempfile.TemporaryDirectory(prefix="bench-batch-stall-") as scratch:
        stack = LocalStack(
            Path(scratch),
            lambda url: config_text(url, model.path, args.batch_niceness),
            own_groups=True,  # a session each, as `trickle up` starts them
            config_name="stall.toml",
        )
        try:
            stack.start_web()
            stack.start_batch(timeout=180)  # a nice consumer starts late on a busy machine
            stack.start_worker("bench-worker", ("demo",))
            assert stack.web_process is not None
            (web_pid,) = child_pids(stack.web_process.pid)
            assert stack.batch_process is not None and stack.redis_process is not None
            pids = {
                "web": stack.web_process.pid,
                "batch": stack.batch_process.pid,
                "worker": stack.workers[0].pid,
                "redis": stack.redis_process.pid,
            }
            progress(f"stack up: web worker pid {web_pid}")
            started_at = os.getpriority(os.PRIO_PROCESS, pids["batch"])
            rows: list[tuple[int, list[Probe]]] = []
            for run in range(args.runs):
                nice = started_at
                if args.alternate is not None and run % 2:
                    nice = args.alternate
                renice(pids["batch"], nice)
                probes, meter = one_run(stack.web_url, web_pid, pids, payload, args.lines)
                label = f"run {run + 1}, {args.lines:,} lines, batch consumer at nice {nice}"
                report(probes, meter, label)
                rows.append((nice, probes))
            summary(rows, os.getloadavg()[0])
        finally:
            stack.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
