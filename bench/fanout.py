"""Fan-out: one gunicorn (gevent) web process holding M SSE readers on a few long jobs.

For each M, on a freshly started web process:

1. submit ``jobs`` long jobs while no worker serves the model, so they wait in the queue;
2. measure the web worker's RSS and Redis's client count (the baseline), then connect M readers
   (``bench.harness.fanout_client``, another process) spread over those jobs, so that every
   reader sees every token live from index 0;
3. measure RSS, Redis clients and ``/healthz`` latency with M idle streams open;
4. start a worker: the jobs run; over a ``window`` of seconds measure the tokens delivered to all
   readers and the tokens the jobs generated (their replay logs' lengths), then RSS, Redis
   clients and ``/healthz`` latency while the M streams are busy;
5. cancel the jobs, close the readers, stop the worker.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from bench.harness.httpio import post_json, probe
from bench.harness.log import progress
from bench.harness.stack import HOST, CpuMeter, Stack, rss_kib
from bench.harness.stats import summary
from bench.roundtrips import command_calls
from trickle import keys
from trickle.config.settings import PROJECT_ROOT

HEALTHZ_BUDGET_SECONDS = 30.0
HEALTHZ_TIMEOUT_SECONDS = 5.0
FIRST_TOKEN_TIMEOUT_SECONDS = 90.0


class ClientProcess:
    """The fan-out readers' process, driven over stdin/stdout JSON lines."""

    def __init__(self, port: int, jobs: list[str], readers: int, log: IO[bytes]):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.harness.fanout_client",
             "--host", HOST, "--port", str(port),
             "--jobs", ",".join(jobs), "--readers", str(readers)],
            cwd=PROJECT_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
        )  # fmt: skip

    def read(self, timeout: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"fan-out client said nothing for {timeout:.0f}s")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"fan-out client exited ({self.process.poll()})")
        message: dict[str, Any] = json.loads(line)
        return message

    def ask(self, command: str, timeout: float = 30.0) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        self.process.stdin.flush()
        return self.read(timeout)

    def stop(self) -> dict[str, Any] | None:
        final = None
        if self.process.poll() is None:
            with contextlib.suppress(OSError, TimeoutError, RuntimeError, ValueError):
                final = self.ask("stop", timeout=30.0)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return final


def healthz_latency(port: int, count: int) -> dict[str, Any]:
    """``count`` sequential GET /healthz on fresh connections, within a time budget."""
    latencies: list[float] = []
    failures = 0
    deadline = time.monotonic() + HEALTHZ_BUDGET_SECONDS
    for _ in range(count):
        if time.monotonic() > deadline:
            break
        status, seconds = probe(HOST, port, "/healthz", timeout=HEALTHZ_TIMEOUT_SECONDS)
        if status == 200:
            latencies.append(seconds * 1000)
        else:
            failures += 1
    return {"ms": summary(latencies), "failures": failures, "requested": count}


def warm_stream(port: int, job_id: str) -> None:
    """Open one SSE stream and drop it: the hub subscription and pools exist before the baseline."""
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall(f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        received = b""
        while b"retry:" not in received:
            data = sock.recv(4096)
            if not data:
                break
            received += data


def token_log_lengths(stack: Stack, jobs: list[str]) -> dict[str, int]:
    assert stack.client is not None
    pipe = stack.client.pipeline(transaction=False)
    for job in jobs:
        pipe.llen(keys.job_tokens(job))
    return dict(zip(jobs, (int(n) for n in pipe.execute()), strict=True))


def run_one(
    stack: Stack,
    model_name: str,
    body: Callable[[], dict[str, Any]],
    readers: int,
    jobs: int,
    window_s: float,
    probes: int,
) -> dict[str, Any]:
    stack.start_web()
    port = stack.web_port
    pid = stack.web_worker_pid()
    assert pid is not None
    job_ids = [post_json(HOST, port, "/v1/jobs", body())["id"] for _ in range(jobs)]
    readers_per_job = {job: readers // jobs + (1 if i < readers % jobs else 0)
                       for i, job in enumerate(job_ids)}  # fmt: skip
    warm_stream(port, job_ids[0])
    time.sleep(0.5)
    out: dict[str, Any] = {"readers": readers, "jobs": jobs, "job_max_tokens": body()["max_tokens"]}
    out["rss_baseline_kib"] = rss_kib(pid)
    out["redis_clients_baseline"] = stack.redis_clients()
    out["web_redis_connections_baseline"] = stack.web_redis_connections()
    log_path = stack.log_dir / f"fanout-client-{readers}.log"
    with log_path.open("ab") as log:
        client = ClientProcess(port, job_ids, readers, log)
        try:
            _measure(stack, model_name, client, pid, port, job_ids, readers_per_job,
                     window_s, probes, out)  # fmt: skip
        finally:
            # Readers first: the web tier stops pushing their backlog, so the rest is quick.
            teardown = time.monotonic()
            out["final_client"] = client.stop()
            for job in job_ids:
                with contextlib.suppress(OSError, ValueError):
                    post_json(HOST, port, f"/v1/jobs/{job}/cancel", None, timeout=10)
            stack.stop_worker(model_name)
            # A job handed back at the worker's shutdown must not run in the next measurement.
            assert stack.client is not None
            out["purged_queue_messages"] = stack.client.llen(keys.model_queue(model_name))
            stack.client.delete(keys.model_queue(model_name))
            out["teardown_s"] = time.monotonic() - teardown
    out["job_states"] = _job_states(port, job_ids)
    out["web_log"] = _web_log_notes(stack)
    stack.stop_web()
    return out


def _measure(
    stack: Stack,
    model_name: str,
    client: ClientProcess,
    pid: int,
    port: int,
    job_ids: list[str],
    readers_per_job: dict[str, int],
    window_s: float,
    probes: int,
    out: dict[str, Any],
) -> None:
    readers = sum(readers_per_job.values())
    connected = client.read(timeout=90 + readers / 20)
    out["connect"] = connected
    progress(
        f"fan-out {readers}: {connected['connected']} readers connected in "
        f"{connected['seconds']:.1f}s ({connected['failed']} failed)"
    )
    time.sleep(1.0)
    out["rss_idle_kib"] = rss_kib(pid)
    out["redis_clients_idle"] = stack.redis_clients()
    out["web_redis_connections_idle"] = stack.web_redis_connections()
    out["healthz_idle"] = healthz_latency(port, probes)
    stack.start_worker(model_name)
    deadline = time.monotonic() + FIRST_TOKEN_TIMEOUT_SECONDS
    while True:
        first = client.ask("snapshot")
        if first["tokens"] > 0 or first["done"] > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    logs_first = token_log_lengths(stack, job_ids)
    assert stack.client is not None
    commands_first = command_calls(stack.client)
    cpu = CpuMeter({**stack.pids(), "readers": client.process.pid})
    end = time.monotonic() + window_s
    last = first
    while time.monotonic() < end and last["done"] == 0:
        time.sleep(min(0.5, max(end - time.monotonic(), 0.0)))
        last = client.ask("snapshot")
    logs_last = token_log_lengths(stack, job_ids)
    commands_last = command_calls(stack.client)
    cpu_percent = cpu.percent()
    span = last["time"] - first["time"]
    generated = {job: logs_last[job] - logs_first[job] for job in job_ids}
    demand = sum(generated[job] * readers_per_job[job] for job in job_ids)
    owed = sum(logs_last[job] * readers_per_job[job] for job in job_ids)
    out["window"] = {
        "seconds": span,
        "ended_early": last["done"] > 0,
        "delivered_tokens": last["tokens"] - first["tokens"],
        "delivered_tokens_per_s": (last["tokens"] - first["tokens"]) / span if span > 0 else None,
        "generated_tokens_per_s": sum(generated.values()) / span if span > 0 else None,
        "jobs_streaming": sum(1 for job in job_ids if generated[job] > 0),
        "generated_per_job": generated,
        "cpu_percent": cpu_percent,
        "demand_tokens_per_s": demand / span if span > 0 else None,
        "backlog_tokens_at_end": owed - last["tokens"],
        "min_reader_tokens": last["min_reader_tokens"],
        "max_reader_tokens": last["max_reader_tokens"],
        "closed_early": last["closed_early"],
        # Redis commands over the window, all clients: LRANGE/HGETALL are readers re-reading
        # the replay log (a resync), PUBLISH/RPUSH the worker's flushes.
        "redis_commands": {
            name: commands_last.get(name, 0) - commands_first.get(name, 0)
            for name in ("publish", "rpush", "lrange", "hgetall", "exec")
        },
    }
    out["rss_streaming_kib"] = rss_kib(pid)
    out["redis_clients_streaming"] = stack.redis_clients()
    out["web_redis_connections_streaming"] = stack.web_redis_connections()
    out["healthz_streaming"] = healthz_latency(port, probes)
    after = client.ask("snapshot")
    out["jobs_still_running_after_probes"] = after["done"] == 0
    window = out["window"]
    progress(
        f"fan-out {readers}: delivered {window['delivered_tokens_per_s'] or 0:.0f} tok/s "
        f"(demand {window['demand_tokens_per_s'] or 0:.0f}), RSS "
        f"{(out['rss_baseline_kib'] or 0) / 1024:.0f} -> {(out['rss_idle_kib'] or 0) / 1024:.0f}"
        f" -> {(out['rss_streaming_kib'] or 0) / 1024:.0f} MiB, healthz p50 "
        f"{out['healthz_streaming']['ms']['p50'] or 0:.1f} ms"
    )


def _job_states(port: int, job_ids: list[str]) -> list[dict[str, Any]]:
    import http.client

    states = []
    for job in job_ids:
        connection = http.client.HTTPConnection(HOST, port, timeout=10)
        try:
            connection.request("GET", f"/v1/jobs/{job}")
            data = json.loads(connection.getresponse().read())
            states.append(
                {
                    "status": data.get("status"),
                    "completion_tokens": (data.get("usage") or {}).get("completion_tokens"),
                    "error": data.get("error"),
                }
            )
        except (OSError, ValueError) as exc:
            states.append({"status": None, "error": repr(exc)})
        finally:
            connection.close()
    return states


def _web_log_notes(stack: Stack) -> dict[str, int]:
    """Warnings the web tier logged during the run (subscription losses, tracebacks, 5xx)."""
    try:
        text = stack.web_log_path().read_text(errors="replace")
    except OSError:
        return {}
    return {
        "subscription_lost": text.count("token subscription lost"),
        "tracebacks": text.count("Traceback"),
        "http_5xx": sum(1 for line in text.splitlines() if '" 5' in line and "HTTP/1" in line),
    }
